"""The performance table in markdown, rendered from `bench all`'s JSON (never edited by hand).

`write_doc` replaces only the part of a document between the two marker comments, so the prose
around the table stays as written while the figures come from a run.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def _num(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, float) and x != x:
        return "n/a"
    if x and abs(x) < 0.1:
        return f"{x:.2g}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


def render(report: dict[str, Any]) -> str:
    """One markdown table: every figure, its reference from the same run, the ratio, the goal."""
    head = (f"Measured by `replaylake bench all{' --quick' if report.get('quick') else ''}` on "
            f"{report.get('cpus', '?')} CPUs ({report.get('machine', '?')}).\n\n")
    lines = ["| section | path | ours | reference (same run) | ratio | goal | met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for section, body in report.get("sections", {}).items():
        if "error" in body:
            lines.append(f"| {section} | failed: {body['error']} | | | | | |")
            continue
        for f in body["figures"]:
            met = {True: "yes", False: "no", None: ""}[f["meets_goal"]]
            lines.append(
                f"| {section} | {f['path']} | {_num(f['value'])} {f['unit']} | "
                f"{_num(f['reference_value'])} ({f['reference']}) | "
                f"{_num(f['ratio'])} {f['ratio_label']} | {f['goal']} | {met} |")
    return head + "\n".join(lines) + "\n"


def write_doc(doc: Path, table: str) -> None:
    """Put ``table`` between the markers of ``doc`` (appended with markers if it has none)."""
    text = doc.read_text() if doc.exists() else ""
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        text = pre + block + rest.split(END, 1)[1]
    else:
        text = text + ("\n" if text and not text.endswith("\n") else "") + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def main(report: Path = typer.Argument(Path("runs/bench/all.json"), help="bench all's JSON"),
         doc: Path = typer.Option(Path("docs/performance.md"), help="document to update")) -> None:
    """Regenerate a document's performance table from a `bench all` JSON.

    Examples:
        replaylake bench table runs/bench/all.json --doc docs/performance.md
    """
    write_doc(doc, render(json.loads(report.read_text())))
    typer.echo(f"table in {doc} regenerated from {report}")


if __name__ == "__main__":
    typer.run(main)
