"""The safe YAML loader: hostile and broken files become located errors, never crashes."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched import schemas
from gitsched.findings import Finding
from gitsched.schemas import Document, Limits, format_json_path, parse_documents

FILE = "teams/vision/jobs/train.yaml"


@pytest.fixture(autouse=True, scope="module", params=["libyaml", "pure-python"])
def parser(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs on both PyYAML parsers: the C one where installed, and the fallback."""
    if request.param == "libyaml" and not yaml.__with_libyaml__:
        pytest.skip("PyYAML was built without libyaml")
    loader = yaml.CSafeLoader if request.param == "libyaml" else yaml.SafeLoader
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schemas.loader, "_Loader", loader)
        yield request.param


def parse(text: str | bytes, limits: Limits | None = None) -> tuple[list[Document], list[Finding]]:
    content = text.encode("utf-8") if isinstance(text, str) else text
    docs, errors = parse_documents(content, FILE, limits or Limits())
    return list(docs), list(errors)


def codes(errors: list[Finding]) -> list[str]:
    return [e.code for e in errors]


def billion_laughs(levels: int = 9) -> bytes:
    lines = ['lol0: &lol0 "lol"']
    for level in range(1, levels + 1):
        refs = ", ".join([f"*lol{level - 1}"] * 9)
        lines.append(f"lol{level}: &lol{level} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


# --- values and positions ---


def test_plain_document_values_and_positions() -> None:
    docs, errors = parse(
        "apiVersion: gitsched.io/v1\n"
        "kind: Job\n"
        "spec:\n"
        "  resources: {gpu: 8, cpu: 0.5}\n"
        "  gpuFlavors:\n"
        "    - h100-80g\n"
        "    - a100-40g\n"
        "  quotas:\n"
        "    - flavor: h100\n"
        "      nominal: 16\n"
    )
    assert errors == []
    (doc,) = docs
    assert doc.data["spec"]["resources"] == {"gpu": 8, "cpu": 0.5}
    assert doc.kind == "Job"
    assert doc.positions[()] == (1, 1)
    assert doc.positions[("kind",)] == (2, 1)
    assert doc.positions[("spec", "resources")] == (4, 3)
    assert doc.positions[("spec", "resources", "cpu")] == (4, 23)
    assert doc.positions[("spec", "gpuFlavors", 0)] == (6, 7)
    assert doc.positions[("spec", "gpuFlavors", 1)] == (7, 7)
    assert doc.positions[("spec", "quotas", 0)] == (9, 7)
    assert doc.positions[("spec", "quotas", 0, "nominal")] == (10, 7)


def test_position_falls_back_to_nearest_ancestor() -> None:
    (doc,), _ = parse("a: 1\nspec:\n  replicas: 2\n")
    assert doc.position(("spec", "missing", 3)) == (2, 1)
    assert doc.position(()) == (1, 1)
    error = doc.error(("spec", "replicas"), "must be >= 1", "schema")
    assert error.format() == f"{FILE}:3:3: $.spec.replicas: must be >= 1 [schema]"
    assert error.to_dict()["line"] == 3


def test_name_is_metadata_name_when_a_string() -> None:
    (doc,), _ = parse("metadata: {name: train}\n")
    assert doc.name == "train"
    (doc,), _ = parse("metadata: {name: 3}\nkind: [1]\n")
    assert doc.name is None
    assert doc.kind is None


def test_yaml_1_1_scalars_but_timestamps_and_binary_stay_strings() -> None:
    (doc,), errors = parse(
        "when: 2001-12-14t21:59:43.10-05:00\n"
        "day: 2024-01-01\n"
        "blob: !!binary aGVsbG8=\n"
        "nothing: ~\n"
        "yes_: yes\n"
        "octal: 017\n"
        "hex: 0x1f\n"
        "sexagesimal: 1:30\n"
        "real: 1.5e+3\n"
        "text: !!str 123\n"
        "quoted: '12'\n"
    )
    assert errors == []
    assert doc.data == {
        "when": "2001-12-14t21:59:43.10-05:00",
        "day": "2024-01-01",
        "blob": "aGVsbG8=",
        "nothing": None,
        "yes_": True,
        "octal": 15,
        "hex": 31,
        "sexagesimal": 90,
        "real": 1500.0,
        "text": "123",
        "quoted": "12",
    }


def test_merge_keys_and_aliases_expand_with_positions_of_the_source() -> None:
    (doc,), errors = parse(
        "base: &base\n  cpu: 4\n  gpu: 1\njob:\n  <<: *base\n  gpu: 2\ncopy: *base\n"
    )
    assert errors == []
    assert doc.data["job"] == {"gpu": 2, "cpu": 4}
    assert doc.data["copy"] == {"cpu": 4, "gpu": 1}
    assert doc.positions[("job", "gpu")] == (6, 3)
    assert doc.positions[("job", "cpu")] == (2, 3)
    assert doc.positions[("copy",)] == (7, 1)
    assert doc.positions[("copy", "gpu")] == (3, 3)
    doc.data["copy"]["cpu"] = 99
    assert doc.data["base"]["cpu"] == 4  # expansions are copies, not shared objects


def test_multi_document_files_keep_their_index_and_skip_empty_documents() -> None:
    docs, errors = parse("# header only\n---\nkind: Node\n---\n# nothing\n---\nkind: Job\n")
    assert errors == []
    assert [(d.index, d.kind) for d in docs] == [(0, "Node"), (2, "Job")]
    assert docs[1].positions[("kind",)] == (7, 1)


def test_an_empty_file_has_no_documents_and_no_errors() -> None:
    assert parse("") == ([], [])
    assert parse("# just a comment\n") == ([], [])


def test_bom_is_accepted() -> None:
    (doc,), errors = parse(b"\xef\xbb\xbfkind: Job\n")
    assert errors == []
    assert doc.positions[("kind",)] == (1, 1)


def test_format_json_path_quotes_odd_keys() -> None:
    assert format_json_path(()) == "$"
    assert format_json_path(("spec", "quotas", 0, "nominal")) == "$.spec.quotas[0].nominal"
    assert (
        format_json_path(("labels", "app.io/name", "it's")) == "$.labels['app.io/name']['it\\'s']"
    )


# --- errors that keep the file's other errors coming ---


def test_duplicate_keys_name_the_key_and_both_lines_and_keep_collecting() -> None:
    docs, errors = parse("kind: Job\nspec:\n  replicas: 1\n  replicas: 2\nkind: Node\n")
    assert docs == []
    assert codes(errors) == ["duplicate-key", "duplicate-key"]
    first, second = errors
    assert (first.line, first.column, first.path) == (4, 3, "$.spec.replicas")
    assert "'replicas'" in first.message and "line 3" in first.message and "line 4" in first.message
    assert (second.line, second.path) == (5, "$.kind")
    assert "line 1" in second.message


def test_only_the_broken_document_of_a_file_is_dropped() -> None:
    docs, errors = parse("kind: Node\n---\na: 1\na: 2\n---\nkind: Job\n")
    assert [d.kind for d in docs] == ["Node", "Job"]
    assert codes(errors) == ["duplicate-key"]


def test_non_string_keys_are_errors() -> None:
    docs, errors = parse("on: push\n1: one\n? [a, b]\n: list\nnull: x\n")
    assert docs == []
    assert codes(errors) == ["yaml"] * 4
    assert [e.line for e in errors] == [1, 2, 3, 5]
    assert "'on' reads as the boolean true" in errors[0].message
    assert "quotes" in errors[0].message
    assert "not a list" in errors[2].message


@pytest.mark.parametrize(
    "text",
    [
        "a: !!python/object/apply:os.system ['touch /tmp/gitsched-pwned']\n",
        "a: !!python/object:builtins.dict {x: 1}\n",
        "a: !!python/name:os.system\n",
        "a: !custom value\n",
        "a: !!set {x, y}\n",
    ],
)
def test_unsafe_or_unknown_tags_are_clean_errors(text: str) -> None:
    docs, errors = parse(text)
    assert docs == []
    assert codes(errors) == ["yaml"]
    assert "is not allowed" in errors[0].message
    assert errors[0].line == 1


def test_python_tags_are_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    parse(f"a: !!python/object/apply:os.system ['touch {marker}']\n")
    assert not marker.exists()


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "42\n", "null\n"])
def test_a_document_that_is_not_a_mapping(text: str) -> None:
    docs, errors = parse(text)
    assert docs == []
    assert codes(errors) == ["not-a-mapping"]
    assert errors[0].line == 1


def test_non_finite_and_oversized_numbers() -> None:
    docs, errors = parse("a: .inf\nb: -.Inf\nc: .nan\nd: " + "9" * 5000 + "\n")
    assert docs == []
    assert [e.line for e in errors] == [1, 2, 3, 4]
    assert "too many digits" in errors[3].message
    assert len(errors[3].message) < 200


# --- syntax errors ---


def test_tabs_are_a_yaml_error_with_a_hint() -> None:
    docs, errors = parse("spec:\n\treplicas: 2\n")
    assert docs == []
    assert codes(errors) == ["yaml"]
    assert errors[0].line == 2
    assert "tabs" in errors[0].message


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: [1, 2\nb: 3\n", 2),
        ("a: b: c\n", 1),
        ("a: 'unterminated\n", 2),
        ("a:\n  - 1\n b: 2\n", 3),
        ("a: *nope\n", 1),
        ("a: &x [1, *x]\n", 1),
    ],
)
def test_syntax_errors_are_located(text: str, line: int) -> None:
    docs, errors = parse(text)
    assert docs == []
    assert codes(errors) == ["yaml"]
    assert errors[0].line == line
    assert errors[0].column is not None and errors[0].column >= 1


def test_documents_before_a_syntax_error_are_kept() -> None:
    docs, errors = parse("kind: Node\n---\nkind: [\n")
    assert [d.kind for d in docs] == ["Node"]
    assert codes(errors) == ["yaml"]


# --- bytes that are not YAML text ---


def test_too_large_is_refused_before_parsing() -> None:
    content = b"a: " + b"x" * (2 * 1024 * 1024) + b"\n"
    docs, errors = parse(content)
    assert docs == []
    assert codes(errors) == ["too-large"]
    assert "1048576" in errors[0].message


def test_nul_bytes_are_binary() -> None:
    docs, errors = parse(b"kind: Job\nspec: \x00\x01\n")
    assert docs == []
    assert codes(errors) == ["binary"]
    assert (errors[0].line, errors[0].column) == (2, 7)
    assert "offset 16" in errors[0].message


def test_latin_1_text_is_an_encoding_error_with_offset_and_line() -> None:
    docs, errors = parse("name: ok\nteam: café\n".encode("latin-1"))
    assert docs == []
    assert codes(errors) == ["encoding"]
    assert errors[0].line == 2
    assert "offset 18" in errors[0].message and "line 2" in errors[0].message


def test_utf16_is_named() -> None:
    _docs, errors = parse("kind: Job\n".encode("utf-16"))
    assert codes(errors) == ["encoding"]
    assert "UTF-16" in errors[0].message


def test_control_characters_are_refused() -> None:
    _docs, errors = parse("a: 1\nb: x\x07y\n")
    assert codes(errors) == ["encoding"]
    assert (errors[0].line, errors[0].column) == (2, 5)


def test_random_binary_junk_is_an_error_not_a_crash() -> None:
    rng = random.Random(20240501)
    for _ in range(200):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        _docs, errors = parse(junk)
        assert all(isinstance(e, Finding) for e in errors)
        if b"\x00" in junk:
            assert codes(errors) == ["binary"]


# --- limits: hostile files fail fast ---


@pytest.mark.timeout(5)
def test_billion_laughs_fails_fast() -> None:
    started = time.perf_counter()
    docs, errors = parse(billion_laughs())
    elapsed = time.perf_counter() - started
    assert docs == []
    assert codes(errors) in (["too-many-nodes"], ["too-many-aliases"])
    assert elapsed < 1.0


@pytest.mark.timeout(5)
def test_alias_limit() -> None:
    text = "a: &a x\nb: [" + ", ".join(["*a"] * 101) + "]\n"
    docs, errors = parse(text)
    assert docs == []
    assert codes(errors) == ["too-many-aliases"]
    assert errors[0].line == 2
    docs, errors = parse("a: &a x\nb: [" + ", ".join(["*a"] * 100) + "]\n")
    assert errors == []


@pytest.mark.timeout(5)
def test_node_limit_counts_plain_values_too() -> None:
    text = "a: [" + ",".join(["1"] * 200) + "]\n"
    assert codes(parse(text, Limits(max_nodes=100))[1]) == ["too-many-nodes"]
    assert parse(text, Limits(max_nodes=1000))[1] == []


@pytest.mark.timeout(5)
def test_deep_nesting_is_refused() -> None:
    docs, errors = parse("[" * 10_000)
    assert docs == []
    assert codes(errors) == ["too-deep"]
    assert errors[0].line == 1


@pytest.mark.timeout(5)
def test_depth_counts_what_an_alias_brings() -> None:
    deep = "a: &deep " + "[" * 40 + "]" * 40 + "\n"
    nested = "b: " + "[" * 30 + "*deep" + "]" * 30 + "\n"
    assert parse(deep)[1] == []
    assert codes(parse(deep + nested)[1]) == ["too-deep"]


def test_depth_limit_is_exact() -> None:
    ok = "a: " + "[" * 63 + "]" * 63 + "\n"  # the root mapping is level 1
    assert parse(ok)[1] == []
    assert codes(parse("a: " + "[" * 64 + "]" * 64 + "\n")[1]) == ["too-deep"]


# --- never raises ---


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(content: bytes) -> None:
    docs, errors = parse_documents(content, FILE)
    assert all(isinstance(e, Finding) for e in errors)
    assert all(isinstance(d, Document) for d in docs)


_YAMLISH = st.text(alphabet=st.sampled_from(list("ab:-[]{},&*!? \n\t'\"#|>0.~%@`")), max_size=80)


@settings(max_examples=500, deadline=None)
@given(_YAMLISH)
def test_yaml_like_text_never_raises(text: str) -> None:
    _docs, errors = parse_documents(text.encode(), FILE)
    for error in errors:
        assert error.code in {"yaml", "encoding", "duplicate-key", "not-a-mapping"}, error
        assert error.format().startswith(FILE)
