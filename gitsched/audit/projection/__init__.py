"""The audit views' fold, in the parts it is made of.

`projector` turns stored events into row operations (`rows.Batch`), remembering what
it must in `state`; `checks` runs the compliance checks on the way, `ledger` keeps
usage accounting (a fold of its own, which a rebuild runs in its writer process);
`vocabulary` and `diffs` are the words and summaries the views share with their
queries. Import from the module that defines a name.
"""
