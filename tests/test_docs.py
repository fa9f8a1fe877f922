"""Every document that the README, docs/ and the package's source cite (a `*.md` name or a `docs/...` path) is
in the repository; the only exceptions are the reports jaxpos itself writes."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A markdown file name or path (`bench/RESULTS.md`), or any path under docs/, not inside a longer word or path.
CITATION = re.compile(r"(?<![\w/.-])((?:[\w-][\w.-]*/)*[\w-][\w.-]*\.md|docs/[\w./-]*[\w])(?![\w/])")

# Reports jaxpos writes into an output folder (cited as OUT/NAME, WORKDIR/NAME or by name), not shipped files.
WRITTEN_REPORTS = {"sweep.md", "REPRODUCTION.md"}


def citing_files() -> list[str]:
    package = glob.glob(os.path.join(ROOT, "jaxpos", "**", "*.py"), recursive=True)
    return [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True),
            *sorted(package)]


def citations(text: str) -> set[str]:
    return {match.group(1) for match in CITATION.finditer(text)}


def is_written_report(cited: str) -> bool:
    """OUT/REPRODUCTION.md, WORKDIR/x.md (a placeholder folder in capitals) or a written report's bare name."""
    parts = cited.split("/")
    return parts[-1] in WRITTEN_REPORTS and (len(parts) == 1 or parts[0].isupper())


def test_the_citation_pattern():
    text = ("see `docs/conventions.md` and REFERENCE.md, bench/RESULTS.md (OUT/REPRODUCTION.md); "
            "path + \".md\"; sweep.json/.md; docs/figures/a.png. A sentence ends in docs/x.")
    assert citations(text) == {"docs/conventions.md", "REFERENCE.md", "bench/RESULTS.md", "OUT/REPRODUCTION.md",
                               "docs/figures/a.png", "docs/x"}
    assert is_written_report("OUT/REPRODUCTION.md") and is_written_report("sweep.md")
    assert not is_written_report("REFERENCE.md") and not is_written_report("docs/REPRODUCTION.md")


def test_every_cited_document_exists():
    missing = []
    for path in citing_files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for cited in sorted(citations(text)):
            if is_written_report(cited):
                continue
            here = os.path.join(os.path.dirname(path), cited)
            if not (os.path.exists(os.path.join(ROOT, cited)) or os.path.exists(here)):
                missing.append(f"{os.path.relpath(path, ROOT)} cites {cited}, which is not in the repository")
    assert not missing, "\n".join(missing)


def test_the_written_reports_are_written_by_the_package():
    source = "".join(open(p, encoding="utf-8").read() for p in citing_files()[1:] if p.endswith(".py"))
    for name in WRITTEN_REPORTS:
        assert f'"{name}"' in source, f"{name} is listed as a written report but no module writes it"


def test_the_conventions_hold_what_the_code_cites():
    with open(os.path.join(ROOT, "docs", "conventions.md"), encoding="utf-8") as f:
        conventions = f.read()
    for needed in ("1/√(2D)", "j − i", "## Analyses", "[[1, .3679, .0183], [.3679, 1, .3679], [.0183, .3679, 1]]",
                   "[2/3, −1/3, 1/3]", "uniform 5×5 → 0.445", "f(i − j − 1)"):
        assert needed in conventions, needed
