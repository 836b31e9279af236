"""The `replaylake` command line: one sub-command per job (each job module holds its own main)."""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="replaylake: a replay buffer for async LLM RL, on Arrow tables.",
                  no_args_is_help=True, add_completion=False)
bench = typer.Typer(help="Benchmarks (figures side by side with the reference, written to a file).",
                    no_args_is_help=True)
app.add_typer(bench, name="bench")
lake = typer.Typer(help="Lake maintenance: find damage, set it aside.", no_args_is_help=True)
app.add_typer(lake, name="lake")

# (group, command, module, function). Job modules keep heavy imports (torch, duckdb, matplotlib)
# inside their main, so `replaylake --help` stays fast.
_COMMANDS = [
    (app, "demo", "jobs.demo", "main"),
    (app, "sql", "jobs.sql_query", "main"),
    (app, "whatif", "jobs.whatif", "main"),
    (app, "audit", "jobs.audit", "main"),
    (app, "soak", "jobs.soak", "main"),
    (app, "export", "jobs.export", "main"),
    (app, "compact", "jobs.compact", "main"),
    (app, "retain", "jobs.retain", "main"),
    (bench, "ingest", "jobs.bench_ingest", "main"),
    (bench, "decide", "jobs.bench_decide", "main"),
    (bench, "torch", "jobs.bench_torch", "main"),
    (bench, "verl", "jobs.bench_verl", "main"),
    (bench, "ray", "jobs.bench_ray", "main"),
    (bench, "sql-memory", "jobs.bench_sql_memory", "main"),
    (bench, "memory", "jobs.bench_memory", "main"),
    (bench, "load", "jobs.bench_load", "main"),
    (bench, "all", "jobs.bench_all", "main"),
    (bench, "table", "jobs.bench_table", "main"),
    (lake, "check", "jobs.lake_tool", "check"),
    (lake, "salvage", "jobs.lake_tool", "salvage"),
]


for group, name, module, func in _COMMANDS:
    group.command(name)(getattr(importlib.import_module(module), func))


if __name__ == "__main__":
    app()
