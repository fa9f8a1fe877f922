"""The README and the guides in docs/ against the repository: every document they or the package's source cite (a
`*.md` name or a `docs/...` path) exists, except the reports jaxpos itself writes; every relative link resolves;
and every command of their fenced blocks is accounted for, by the CLI's parser (no command runs) or by a named test
that runs or dry-runs it."""

import ast
import contextlib
import glob
import io
import os
import re
import shlex
import sys

from jaxpos.cli import parse_command
from jaxpos.config.files import apply_overrides, load_config
from jaxpos.positions import MECHANISMS, import_mechanisms
from jaxpos.positions.registry import IMPORT_VARIABLE
from tests.helpers import extending_example

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A markdown file name or path (`bench/RESULTS.md`), or any path under docs/, not inside a longer word or path.
CITATION = re.compile(r"(?<![\w/.-])((?:[\w-][\w.-]*/)*[\w-][\w.-]*\.md|docs/[\w./-]*[\w])(?![\w/])")

# Reports jaxpos writes into an output folder (cited as OUT/NAME, WORKDIR/NAME or by name), not shipped files.
WRITTEN_REPORTS = {"sweep.md", "REPRODUCTION.md", "COMPARISON.md"}


def documents() -> list[str]:
    """The README and the guides."""
    guides = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return [os.path.join(ROOT, "README.md"), *sorted(guides)]


def citing_files() -> list[str]:
    package = glob.glob(os.path.join(ROOT, "jaxpos", "**", "*.py"), recursive=True)
    return [*documents(), *sorted(package)]


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


def test_the_readme_keeps_the_command_that_ci_runs():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert "make test   # " in readme.split("## Two commands", 1)[1].split("```")[1]
    assert ci.rstrip().endswith("make test")


# A markdown link to a file of the repository: [text](path) or [text](path#anchor), not a URL.
LINK = re.compile(r"\]\((?![a-z]+:)([^)#\s]*)(?:#([^)\s]*))?\)")


def anchor(heading: str) -> str:
    """The anchor a markdown renderer gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_resolves():
    broken = []
    for path in documents():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for target, fragment in LINK.findall(text):
            linked = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
            if not os.path.exists(linked):
                broken.append(f"{os.path.relpath(path, ROOT)} links to {target}, which does not exist")
            elif fragment and linked.endswith(".md"):
                with open(linked, encoding="utf-8") as f:
                    anchors = {anchor(line.lstrip("#")) for line in f if line.startswith("#")}
                if fragment not in anchors:
                    broken.append(f"{os.path.relpath(path, ROOT)} links to {target}#{fragment}: no such heading")
    assert not broken, "\n".join(broken)


# Documented commands that a test runs or dry-runs (a launch or benchmark script, which the parser cannot check),
# as shlex.join writes them, each with that test; a script command missing here fails
# test_every_documented_command_is_accounted_for.
RUN_BY_TESTS = {
    "launch/tpu_pod.sh my-v4-32 us-central2-b configs/mlm/diet.py gs://BUCKET/runs/diet --config.mesh.fsdp=4 "
    "--config.data.tokenizer_path=gs://BUCKET/spm_diet.model":
        "tests/test_launch.py::test_tpu_pod_copies_installs_and_trains_on_every_worker",
    "sbatch --nodes=4 launch/slurm.sbatch configs/mlm/bert_base.py /shared/runs/base":
        "tests/test_launch.py::test_slurm_starts_one_process_per_gpu_or_per_node",
    "launch/local.sh configs/mlm/bert_base.py runs/base":
        "tests/test_launch.py::test_local_runs_one_process_on_this_host",
    "launch/reproduce.sbatch /shared/repro --profile full":
        "tests/reproduction/test_reproduce.py::test_the_slurm_array_script_dry_run",
    "'REPRODUCE=--mechanisms none,tisa --claims tisa_local,muppet_exact --seeds 3 --workers 6' REPRODUCE_S=195 "
    "bash bench/gpu_runs.sh reproduce":
        "tests/test_bench.py::test_gpu_runbook_reproduces_a_subset",
    "bash bench/gpu_runs.sh lengths":
        "tests/test_bench.py::test_the_lengths_stage_runs_at_a_tiny_size_and_a_later_host_continues_from_its_pack",
}

SHELL_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def documented_commands() -> list[tuple[str, list[str]]]:
    """(document, argv) for every command line of a fenced block in the README and docs/ (not the Python ones):
    continuation lines joined, comments dropped."""
    commands = []
    for path in documents():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for language, block in re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.M | re.S):
            if language.strip() == "python":  # run by tests/test_docs_snippets.py
                continue
            for line in block.replace("\\\n", " ").splitlines():
                argv = shlex.split(line, comments=True)
                if argv:
                    commands.append((os.path.relpath(path, ROOT), argv))
    return commands


def command_target(argv: list[str]) -> tuple[str, list[str]] | None:
    """("jaxpos", its arguments) for a `jaxpos` command, ("script", argv) for a launch or benchmark script, None
    for anything else (make, pip)."""
    words = list(argv)
    while words and SHELL_ASSIGNMENT.match(words[0]):  # NAME=value before the command
        words.pop(0)
    if words[:1] == ["sbatch"]:  # sbatch's own options, then the script
        words = [words[0], *[w for w in words[1:] if not w.startswith("-")][:1]]
    if not words:
        return None
    program = os.path.basename(words[0])
    if program == "jaxpos":
        return "jaxpos", words[1:]
    if program.startswith("python") and words[1:2] == ["-m"] and len(words) > 2:
        if words[2] == "jaxpos" or words[2].startswith("jaxpos."):
            return "jaxpos", words[3:]
        return ("script", argv) if words[2].startswith("bench") else None
    scripts = [w for w in words[:2] if w.startswith(("launch/", "bench/"))]  # launch/x.sh, bash x, python x, sbatch x
    return ("script", argv) if scripts else None


def config_problem(config_file: str | None, overrides: list[str]) -> str | None:
    """Why `--config.a.b=value` overrides do not apply to a config file of the repository, or None."""
    if not overrides:
        return None
    if config_file is None or not os.path.exists(os.path.join(ROOT, config_file)):
        return f"overrides {overrides} without a config file of the repository to check them against"
    try:
        apply_overrides(load_config(os.path.join(ROOT, config_file)), overrides)
    except (ValueError, KeyError) as error:
        return str(error)
    return None


def command_problem(argv: list[str]) -> str | None:
    """Why a documented command is not accounted for (an unknown subcommand or flag, an override of a missing
    config field, a script command that no test runs), or None. Runs nothing."""
    target = command_target(argv)
    if target is None:
        return None
    kind, words = target
    overrides = [w for w in words if w.startswith("--config.")]
    if kind == "script":
        named = RUN_BY_TESTS.get(shlex.join(argv))
        if named is None:
            return "a script command that RUN_BY_TESTS does not list with the test that runs it"
        config_file = next((w for w in words if w.startswith("configs/") and w.endswith(".py")), None)
        return config_problem(config_file, overrides)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args, overrides = parse_command(words)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    if getattr(args, "imports", None):  # a researcher's mechanism, registered as the command would
        import_mechanisms(args.imports)
    return config_problem(getattr(args, "config", None), overrides)


def test_every_documented_command_is_accounted_for(tmp_path, monkeypatch):
    name, source = extending_example()  # docs/extending.md's commands import its example mechanism
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(IMPORT_VARIABLE, "")  # restored after: no later command of this process imports it
    try:
        problems = [f"{document}: {shlex.join(argv)}: {problem}" for document, argv in documented_commands()
                    if (problem := command_problem(argv))]
    finally:  # the example's kind leaves the registry again
        for kind in [k for k, m in MECHANISMS.items() if m.source == name]:
            del MECHANISMS[kind]
        sys.modules.pop(name, None)
    assert not problems, "\n".join(problems)
    assert sum(command_target(argv) is not None for _, argv in documented_commands()) >= 20  # the blocks were read


def test_the_tests_that_run_documented_commands_exist():
    for command, named in RUN_BY_TESTS.items():
        path, name = named.split("::")
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            source = f.read()
        test = next((node for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.FunctionDef) and node.name == name), None)
        assert test is not None, f"{named} does not exist"
        script = next(w for w in shlex.split(command) if w.startswith(("launch/", "bench/")))
        assert os.path.basename(script) in ast.get_source_segment(source, test), f"{named} does not run {script}"
        assert any(shlex.split(command) == argv for _, argv in documented_commands()), f"{command} is not documented"


def test_a_command_with_a_missing_flag_or_field_is_not_accounted_for():
    train = ["jaxpos", "train", "--config", "configs/mlm/tiny.py", "--workdir", "runs/t"]
    assert command_problem(train) is None
    assert command_problem([".venv/bin/jaxpos", *train[1:], "--config.train.num_steps=3"]) is None
    assert "unrecognised arguments: --steps" in command_problem([*train, "--steps", "3"])
    assert "invalid choice" in command_problem(["python", "-m", "jaxpos.cli", "trian", "--config", "c.py"])
    assert "required" in command_problem(["jaxpos", "export", "--workdir", "runs/t"])
    assert "num_step" in command_problem([*train, "--config.train.num_step=3"])
    assert "RUN_BY_TESTS" in command_problem(["DRY_RUN=1", "bash", "launch/local.sh", "configs/mlm/tiny.py", "w"])
    assert "RUN_BY_TESTS" in command_problem(["python", "-m", "bench.profile_step", "--kind", "tisa"])
    assert command_problem(["make", "test"]) is None and command_problem(["pip", "install", "jaxpos[bible]"]) is None
