"""The performance table in markdown, rendered from `bench all`'s JSON (never edited by hand).

`write_doc` replaces only the part of a document between marker comments, so the prose around
the table stays as written while the figures come from a run: the whole table between the
`bench-table` markers (docs/performance.md), the summary -- only the figures that have a
goal -- between the `bench-summary` markers (the README), and the Ray actor's figures between the
`bench-ray` markers (docs/scaling.md).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- bench-summary:begin -->", "<!-- bench-summary:end -->"
RAY_BEGIN, RAY_END = "<!-- bench-ray:begin -->", "<!-- bench-ray:end -->"


def number(x: Any) -> str:
    """A figure as the tables print it (three significant digits, thousands separated)."""
    if x is None:
        return ""
    if isinstance(x, float) and x != x:
        return "n/a"
    if x and abs(x) < 0.1:
        return f"{x:.2g}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


def figure_line(f: dict[str, Any]) -> str:
    """One figure on one line: path, value, the reference from the same run, ratio and goal."""
    return (f"{f['path']}: {number(f['value'])} {f['unit']} against {number(f['reference_value'])} "
            f"({f['reference']}), {number(f['ratio'])} {f['ratio_label']}; goal {f['goal']}")


def render(report: dict[str, Any], goals_only: bool = False,
           sections: tuple[str, ...] | None = None) -> str:
    """One markdown table: every figure (``goals_only``: every figure that has a goal, and the
    figures that belong beside them, such as a background mirror's CPU cost per step; ``sections``:
    only those sections'), its reference from the same run, the ratio, the goal."""
    head = (f"Measured by `replaylake dev bench all{' --quick' if report.get('quick') else ''}` on "
            f"{report.get('cpus', '?')} CPUs ({report.get('machine', '?')}).\n\n")
    lines = ["| section | path | ours | reference (same run) | ratio | goal | met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for section, body in report.get("sections", {}).items():
        if sections is not None and section not in sections:
            continue
        if "error" in body:
            lines.append(f"| {section} | failed: {body['error']} | | | | | |")
            continue
        for f in body["figures"]:
            if goals_only and f["meets_goal"] is None and not f.get("in_summary"):
                continue
            met = {True: "yes", False: "no", None: ""}[f["meets_goal"]]
            lines.append(
                f"| {section} | {f['path']} | {number(f['value'])} {f['unit']} | "
                f"{number(f['reference_value'])} ({f['reference']}) | "
                f"{number(f['ratio'])} {f['ratio_label']} | {f['goal']} | {met} |")
    return head + "\n".join(lines) + "\n"


def write_doc(doc: Path, table: str, summary: str | None = None, ray: str | None = None) -> None:
    """Put ``table`` between the `bench-table` markers of ``doc``, ``summary`` between its
    `bench-summary` markers and ``ray`` between its `bench-ray` markers; a document with none of
    these pairs gets the table appended, with markers."""
    text = doc.read_text() if doc.exists() else ""
    found = False
    for begin, end, body in ((BEGIN, END, table), (SUMMARY_BEGIN, SUMMARY_END, summary),
                             (RAY_BEGIN, RAY_END, ray)):
        if body is not None and begin in text and end in text:
            pre, rest = text.split(begin, 1)
            text = pre + f"{begin}\n{body}{end}" + rest.split(end, 1)[1]
            found = True
    if not found:
        block = f"{BEGIN}\n{table}{END}"
        text = text + ("\n" if text and not text.endswith("\n") else "") + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def write_docs(docs: list[Path], report: dict[str, Any]) -> None:
    """The table, the summary and the Ray figures of ``report`` into every document of ``docs``."""
    table, summary = render(report), render(report, goals_only=True)
    ray = render(report, sections=("ray",))
    for doc in docs:
        write_doc(doc, table, summary, ray)


def main(report: Path = typer.Argument(Path("runs/bench/all.json"), help="bench all's JSON"),
         doc: list[Path] = typer.Option([Path("docs/performance.md"), Path("README.md"),
                                         Path("docs/scaling.md")],
                                        help="document to update (repeat for several)")) -> None:
    """Regenerate the performance table, the README's summary and the Ray figures of
    docs/scaling.md from a `bench all` JSON.

    Examples:
        replaylake dev bench table runs/bench/all.json
        replaylake dev bench table runs/bench/all.json --doc docs/performance.md
    """
    write_docs(doc, json.loads(report.read_text()))
    typer.echo(f"tables in {', '.join(map(str, doc))} regenerated from {report}")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
