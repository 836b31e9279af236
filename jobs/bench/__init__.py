"""The benchmarks (`replaylake dev bench ...`): each figure beside a reference measured in the same
run. One module per section; `all` runs every one, `table` renders the docs' table, `out` is shared."""
