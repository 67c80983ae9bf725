"""Safe YAML loading that remembers the line and column of every value.

Specs come from anyone who can push to the cluster repo, so a file is parsed with hard
limits on size, depth, aliases and expanded values, and every problem is a value, not
an exception, located where the author can find it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml
import yaml.constructor
import yaml.events
import yaml.nodes
import yaml.resolver

from gitsched.findings import Finding

JsonPath = tuple[str | int, ...]

_YAML_TAG = "tag:yaml.org,2002:"
_MERGE_TAG = _YAML_TAG + "merge"
_STR_TAG = _YAML_TAG + "str"
_MAP_TAGS = frozenset({None, "!", _YAML_TAG + "map"})
_SEQ_TAGS = frozenset({None, "!", _YAML_TAG + "seq"})
# Timestamps and binary stay as the text the author wrote: the data model is JSON,
# and a silently converted datetime would not survive the event log's encoding.
_TEXT_TAGS = frozenset(
    {_STR_TAG, _YAML_TAG + "timestamp", _YAML_TAG + "binary", _YAML_TAG + "value", _MERGE_TAG}
)
# YAML forbids these characters anywhere in a stream (same set as PyYAML's reader);
# checking them first gives one message with a line and column for both parsers.
_NON_PRINTABLE = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UTF8_BOM = b"\xef\xbb\xbf"

# The C parser is several times faster; both report the same marks.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def format_json_path(path: Sequence[str | int]) -> str:
    """`("spec", "quotas", 0, "nominal")` -> `$.spec.quotas[0].nominal`."""
    parts = ["$"]
    for step in path:
        if isinstance(step, int):
            parts.append(f"[{step}]")
        elif _PLAIN_KEY.match(step):
            parts.append(f".{step}")
        else:
            escaped = step.replace("\\", "\\\\").replace("'", "\\'")
            parts.append(f"['{escaped}']")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep a hostile or broken file from costing more than a small file."""

    max_bytes: int = 1 << 20
    max_depth: int = 64
    max_aliases: int = 100
    max_nodes: int = 100_000
    # Items of one list or entries of one mapping: no field of any kind means thousands
    # (the schemas bound each list far lower, by what it means); stopped while parsing.
    max_items: int = 4096
    # A team's files (its queue, OWNERS and jobs) are small by nature: these bound them.
    max_team_file_bytes: int = 256 << 10
    max_team_file_nodes: int = 10_000
    # A commit's budget, checked from the tree's listing before any file is read.
    max_commit_files: int = 200_000
    max_commit_bytes: int = 256 << 20


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document as JSON-compatible data, with where each value was written.

    A mapping entry is located at its key (where an editor should jump for an unknown or
    wrong field), a list item at the item; values an alias brings in keep the position
    of the text they were copied from.
    """

    file: str
    index: int
    data: dict[str, Any]
    positions: Mapping[JsonPath, tuple[int, int]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def kind(self) -> str | None:
        kind = self.data.get("kind")
        return kind if isinstance(kind, str) else None

    @property
    def name(self) -> str | None:
        metadata = self.data.get("metadata")
        if isinstance(metadata, dict):
            name = metadata.get("name")
            if isinstance(name, str):
                return name
        return None

    def position(self, path: Sequence[str | int]) -> tuple[int, int]:
        """Where `path` was written; for a path that does not exist, its nearest ancestor."""
        steps = tuple(path)
        for end in range(len(steps), -1, -1):
            found = self.positions.get(steps[:end])
            if found is not None:
                return found
        return (1, 1)

    def error(self, path: Sequence[str | int], message: str, code: str) -> Finding:
        line, column = self.position(path)
        return Finding(self.file, line, column, format_json_path(path), message, code)


# --- composition: events -> a small node graph, with limits enforced as it grows ---


class _Node:
    __slots__ = ("anchor", "column", "height", "line", "size", "tag")

    def __init__(self, tag: str | None, anchor: str | None, mark: Any) -> None:
        self.tag = tag
        self.anchor = anchor
        self.line = int(mark.line) + 1
        self.column = int(mark.column) + 1
        # Values this node stands for once aliases are expanded, and its nesting height:
        # an alias costs what its target costs, which is what stops billion-laughs files.
        self.size = 1
        self.height = 0


class _Scalar(_Node):
    __slots__ = ("implicit", "value")

    def __init__(self, event: yaml.events.ScalarEvent) -> None:
        super().__init__(event.tag, event.anchor, event.start_mark)
        self.value: str = event.value
        self.implicit: tuple[bool, bool] = event.implicit


class _Collection(_Node):
    __slots__ = ("children",)

    def __init__(self, tag: str | None, anchor: str | None, mark: Any) -> None:
        super().__init__(tag, anchor, mark)
        self.children: list[_Node] = []
        self.height = 1


class _Sequence(_Collection):
    __slots__ = ()


class _Mapping(_Collection):
    """`children` alternates key, value."""

    __slots__ = ()

    def pairs(self) -> Iterator[tuple[_Node, _Node]]:
        items = self.children
        for i in range(0, len(items) - 1, 2):
            yield items[i], items[i + 1]


class _Alias(_Node):
    __slots__ = ("target",)

    def __init__(self, target: _Node, mark: Any) -> None:
        super().__init__(None, None, mark)
        self.target = target
        self.size = target.size
        self.height = target.height


class _Stop(Exception):
    """Parsing of the file cannot go on: a limit was reached or the graph is unusable."""

    def __init__(self, code: str, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.line = line
        self.column = column


class _Composer:
    """Turns the parser's event stream into one node graph per document.

    Works on events rather than PyYAML's composer so that depth, alias and size limits
    apply before anything large or deep exists, and without recursion.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.values = 0
        self.aliases = 0

    def documents(self, loader: Any) -> Iterator[_Node | None]:
        anchors: dict[str, _Node] = {}
        open_anchors: set[str] = set()
        stack: list[_Collection] = []
        root: _Node | None = None
        while loader.check_event():
            event = loader.get_event()
            node: _Node | None = None
            if isinstance(event, yaml.events.DocumentStartEvent):
                anchors, open_anchors, stack, root = {}, set(), [], None
            elif isinstance(event, yaml.events.DocumentEndEvent):
                yield root
            elif isinstance(event, yaml.events.ScalarEvent):
                node = _Scalar(event)
                self._count(1, node)
            elif isinstance(event, yaml.events.SequenceStartEvent | yaml.events.MappingStartEvent):
                kind = _Sequence if isinstance(event, yaml.events.SequenceStartEvent) else _Mapping
                collection = kind(event.tag, event.anchor, event.start_mark)
                self._count(1, collection)
                self._check_depth(len(stack) + 1, collection)
                if collection.anchor is not None:
                    open_anchors.add(collection.anchor)
                stack.append(collection)
            elif isinstance(event, yaml.events.SequenceEndEvent | yaml.events.MappingEndEvent):
                node = stack.pop()
                assert isinstance(node, _Collection)
                node.size = 1 + sum(child.size for child in node.children)
                node.height = 1 + max((child.height for child in node.children), default=0)
                if node.anchor is not None:
                    open_anchors.discard(node.anchor)
            elif isinstance(event, yaml.events.AliasEvent):
                node = self._alias(event, anchors, open_anchors, len(stack))
            if node is None:
                continue
            if node.anchor is not None:
                anchors[node.anchor] = node
            if stack:
                parent = stack[-1]
                parent.children.append(node)
                if len(parent.children) > self._most_children(parent):
                    what = "entries" if isinstance(parent, _Mapping) else "items"
                    raise _Stop(
                        "too-many-items",
                        f"a {'mapping' if what == 'entries' else 'list'} of more than "
                        f"{self.limits.max_items} {what}; no field holds that many",
                        parent.line,
                        parent.column,
                    )
            else:
                root = node

    def _most_children(self, parent: _Collection) -> int:
        return self.limits.max_items * (2 if isinstance(parent, _Mapping) else 1)

    def _alias(
        self,
        event: yaml.events.AliasEvent,
        anchors: dict[str, _Node],
        open_anchors: set[str],
        depth: int,
    ) -> _Alias:
        mark: Any = event.start_mark
        line, column = mark.line + 1, mark.column + 1
        name = event.anchor or ""
        self.aliases += 1
        if self.aliases > self.limits.max_aliases:
            raise _Stop(
                "too-many-aliases",
                f"more than {self.limits.max_aliases} aliases (*name) in one file",
                line,
                column,
            )
        if name in open_anchors:
            raise _Stop(
                "yaml",
                f"alias '*{name}' is used inside the node it names; "
                "recursive structures are not allowed",
                line,
                column,
            )
        target = anchors.get(name)
        if target is None:
            raise _Stop("yaml", f"alias '*{name}' has no anchor '&{name}' before it", line, column)
        alias = _Alias(target, event.start_mark)
        self._count(alias.size, alias)
        self._check_depth(depth + alias.height, alias)
        return alias

    def _count(self, values: int, node: _Node) -> None:
        self.values += values
        if self.values > self.limits.max_nodes:
            raise _Stop(
                "too-many-nodes",
                f"the file expands to more than {self.limits.max_nodes} values"
                " (aliases count once per use)",
                node.line,
                node.column,
            )

    def _check_depth(self, depth: int, node: _Node) -> None:
        if depth > self.limits.max_depth:
            raise _Stop(
                "too-deep",
                f"nesting deeper than {self.limits.max_depth} levels",
                node.line,
                node.column,
            )


# --- construction: node graph -> JSON-compatible values and positions ---

_RESOLVER: Any = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


def _quote(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return repr(value)


class _Builder:
    """Builds one document's values; problems are collected, the document is then dropped."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.positions: dict[JsonPath, tuple[int, int]] = {}
        self.errors: list[Finding] = []

    def fail(self, node: _Node, path: JsonPath, message: str, code: str = "yaml") -> None:
        self.errors.append(
            Finding(self.file, node.line, node.column, format_json_path(path), message, code)
        )

    def value(self, node: _Node, path: JsonPath) -> Any:
        while isinstance(node, _Alias):
            node = node.target
        if isinstance(node, _Scalar):
            return self.scalar(node, path)
        if isinstance(node, _Sequence):
            if node.tag not in _SEQ_TAGS:
                self.fail(node, path, self._tag_message(node.tag))
            items: list[Any] = []
            for index, item in enumerate(node.children):
                self.positions[(*path, index)] = (item.line, item.column)
                items.append(self.value(item, (*path, index)))
            return items
        assert isinstance(node, _Mapping)
        return self.mapping(node, path)

    def mapping(self, node: _Mapping, path: JsonPath) -> dict[str, Any]:
        if node.tag not in _MAP_TAGS:
            self.fail(node, path, self._tag_message(node.tag))
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        merges: list[tuple[_Node, _Node]] = []
        for key_node, value_node in node.pairs():
            key = self.key(key_node, path)
            if key is None:
                continue
            if key is _MERGE:
                merges.append((key_node, value_node))
                continue
            assert isinstance(key, str)
            if key in first_line:
                self.fail(
                    key_node,
                    (*path, key),
                    f"duplicate key '{key}' (first at line {first_line[key]},"
                    f" again at line {key_node.line})",
                    "duplicate-key",
                )
                continue
            first_line[key] = key_node.line
            self.positions[(*path, key)] = (key_node.line, key_node.column)
            result[key] = self.value(value_node, (*path, key))
        if len(merges) > 1:
            second = merges[1][0]
            self.fail(
                second,
                path,
                f"duplicate key '<<' (first at line {merges[0][0].line},"
                f" again at line {second.line}); list several mappings in one '<<' instead",
                "duplicate-key",
            )
        for _, source in merges[:1]:
            for key_node, value_node in self.merged_pairs(source, path):
                key = self.key(key_node, path)
                if isinstance(key, str) and key not in result:
                    self.positions[(*path, key)] = (key_node.line, key_node.column)
                    result[key] = self.value(value_node, (*path, key))
        return result

    def merged_pairs(self, source: _Node, path: JsonPath) -> list[tuple[_Node, _Node]]:
        """The entries a `<<` key brings in; earlier sources win, as in PyYAML."""
        while isinstance(source, _Alias):
            source = source.target
        sources: list[_Node] = source.children if isinstance(source, _Sequence) else [source]
        pairs: list[tuple[_Node, _Node]] = []
        for item in sources:
            while isinstance(item, _Alias):
                item = item.target
            if not isinstance(item, _Mapping):
                self.fail(item, path, "a merge key '<<' needs a mapping or a list of mappings")
                continue
            own: list[tuple[_Node, _Node]] = []
            nested: list[tuple[_Node, _Node]] = []
            for key_node, value_node in item.pairs():
                if self._is_merge_key(key_node):
                    nested.extend(self.merged_pairs(value_node, path))
                else:
                    own.append((key_node, value_node))
            pairs.extend(own + nested)
        return pairs

    @staticmethod
    def _is_merge_key(node: _Node) -> bool:
        while isinstance(node, _Alias):
            node = node.target
        return isinstance(node, _Scalar) and _scalar_tag(node) == _MERGE_TAG

    def key(self, node: _Node, path: JsonPath) -> object | None:
        """The key as a string, `_MERGE` for `<<`, or None after reporting a bad key."""
        target = node
        while isinstance(target, _Alias):
            target = target.target
        if not isinstance(target, _Scalar):
            kind = "a list" if isinstance(target, _Sequence) else "a mapping"
            self.fail(node, path, f"mapping keys must be strings, not {kind}")
            return None
        if _scalar_tag(target) == _MERGE_TAG:
            return _MERGE
        value = self.scalar(target, path, report_at=node)
        if isinstance(value, str):
            return value
        if value is _INVALID:
            return None
        self.fail(
            node,
            path,
            f"mapping keys must be strings: {_quote(target.value)} reads as {_describe(value)};"
            " put it in quotes",
        )
        return None

    def scalar(self, node: _Scalar, path: JsonPath, report_at: _Node | None = None) -> Any:
        tag = _scalar_tag(node)
        where = report_at or node
        if tag in _TEXT_TAGS:
            return node.value
        if tag == _YAML_TAG + "null":
            return None
        try:
            if tag == _YAML_TAG + "bool":
                return _CONSTRUCTOR.bool_values[node.value.lower()]
            if tag == _YAML_TAG + "int":
                number = _CONSTRUCTOR.construct_yaml_int(yaml.nodes.ScalarNode(tag, node.value))
                return int(number)
            if tag == _YAML_TAG + "float":
                real = _CONSTRUCTOR.construct_yaml_float(yaml.nodes.ScalarNode(tag, node.value))
                if not math.isfinite(real):
                    self.fail(where, path, f"{_quote(node.value)} is not a finite number")
                    return _INVALID
                return float(real)
        except (KeyError, ValueError, OverflowError) as exc:
            detail = " (too many digits)" if "digits" in str(exc) else ""
            self.fail(where, path, f"{_quote(node.value)} is not a valid {_short_tag(tag)}{detail}")
            return _INVALID
        self.fail(where, path, self._tag_message(tag))
        return _INVALID

    @staticmethod
    def _tag_message(tag: str | None) -> str:
        return (
            f"tag '{_short_tag(tag or '')}' is not allowed: specs hold plain data"
            " (strings, numbers, booleans, null, lists and mappings)"
        )


_MERGE = object()
_INVALID = object()


def _scalar_tag(node: _Scalar) -> str:
    if node.tag is None or node.tag == "!":
        resolved: str = _RESOLVER.resolve(yaml.nodes.ScalarNode, node.value, node.implicit)
        return resolved
    return node.tag


# --- the whole file ---


def _check_bytes(content: bytes, file: str, limits: Limits) -> Finding | None:
    if len(content) > limits.max_bytes:
        return Finding(
            file,
            None,
            None,
            "$",
            f"file is {len(content)} bytes; the limit is {limits.max_bytes}",
            "too-large",
        )
    if content.startswith((b"\xff\xfe", b"\xfe\xff")):
        return Finding(file, 1, 1, "$", "file is UTF-16 text; save it as UTF-8", "encoding")
    nul = content.find(b"\x00")
    if nul >= 0:
        line = content.count(b"\n", 0, nul) + 1
        return Finding(
            file,
            line,
            nul - (content.rfind(b"\n", 0, nul) + 1) + 1,
            "$",
            f"file contains a NUL byte at offset {nul}: it looks binary, not YAML text",
            "binary",
        )
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content.count(b"\n", 0, exc.start) + 1
        column = exc.start - (content.rfind(b"\n", 0, exc.start) + 1) + 1
        return Finding(
            file,
            line,
            column,
            "$",
            f"file is not valid UTF-8: byte 0x{content[exc.start]:02x} at offset {exc.start}"
            f" (line {line}); save it as UTF-8",
            "encoding",
        )
    return None


def _check_characters(text: str, file: str) -> Finding | None:
    found = _NON_PRINTABLE.search(text)
    if found is None:
        return None
    start = found.start()
    line = text.count("\n", 0, start) + 1
    column = start - (text.rfind("\n", 0, start) + 1) + 1
    return Finding(
        file,
        line,
        column,
        "$",
        f"character U+{ord(found.group()):04X} is not allowed in YAML text",
        "encoding",
    )


def _yaml_error(file: str, text: str, exc: yaml.YAMLError, max_depth: int) -> Finding:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if "maximum nesting depth" in problem:
            # libyaml (PyYAML >= 6.0.3 bundles one with a limit) refuses deep flow
            # nesting while scanning ahead, before our own limit sees the level.
            line = mark.line + 1 if mark is not None else None
            return Finding(
                file, line, None, "$", f"nesting deeper than {max_depth} levels", "too-deep"
            )
        if exc.context and exc.problem:
            problem = f"{problem} ({exc.context}"
            if exc.context_mark is not None:
                problem += f" at line {exc.context_mark.line + 1}"
            problem += ")"
        if mark is not None and _char_at(text, mark.line, mark.column) == "\t":
            problem += "; indent with spaces, not tabs"
        if mark is not None:
            return Finding(file, mark.line + 1, mark.column + 1, "$", problem, "yaml")
        return Finding(file, None, None, "$", problem, "yaml")
    return Finding(file, None, None, "$", f"invalid YAML: {exc}", "yaml")


def _char_at(text: str, line: int, column: int) -> str:
    lines = text.split("\n", line + 1)
    if line < len(lines) and column < len(lines[line]):
        return lines[line][column]
    return ""


def _is_empty(root: _Node | None) -> bool:
    return root is None or (
        isinstance(root, _Scalar) and root.tag is None and root.value == "" and root.implicit[0]
    )


def parse_documents(
    content: bytes, file: str, limits: Limits = Limits()
) -> tuple[tuple[Document, ...], tuple[Finding, ...]]:
    """Every document of a file that parsed cleanly, and every problem found.

    A document with any problem is left out, so later checks never see a guess at what
    its author meant. Never raises for bad input.
    """
    early = _check_bytes(content, file, limits)
    if early is not None:
        return (), (early,)
    text = content.removeprefix(_UTF8_BOM).decode("utf-8")
    early = _check_characters(text, file)
    if early is not None:
        return (), (early,)

    documents: list[Document] = []
    errors: list[Finding] = []
    loader = _Loader(text)
    try:
        for index, root in enumerate(_Composer(limits).documents(loader)):
            if root is None or _is_empty(root):
                continue
            if not isinstance(root, _Mapping):
                kind = "a list" if isinstance(root, _Sequence) else "a single value"
                errors.append(
                    Finding(
                        file,
                        root.line,
                        root.column,
                        "$",
                        f"a document must be a mapping (apiVersion:, kind:, metadata:,"
                        f" spec:), not {kind}",
                        "not-a-mapping",
                    )
                )
                continue
            builder = _Builder(file)
            builder.positions[()] = (root.line, root.column)
            data = builder.mapping(root, ())
            if builder.errors:
                errors.extend(builder.errors)
                continue
            documents.append(Document(file, index, data, MappingProxyType(builder.positions)))
    except _Stop as stop:
        errors.append(Finding(file, stop.line, stop.column, "$", stop.message, stop.code))
    except yaml.YAMLError as exc:
        errors.append(_yaml_error(file, text, exc, limits.max_depth))
    except Exception as exc:  # a parser bug must still not reach the user as a traceback
        errors.append(
            Finding(file, None, None, "$", f"could not parse YAML: {type(exc).__name__}", "yaml")
        )
    finally:
        loader.dispose()
    errors.sort(key=lambda e: (e.line or 0, e.column or 0))
    return tuple(documents), tuple(errors)
