"""The command line is the only layer that parses arguments or writes to the console: below jaxpos/cli/, no module
imports argparse or registers arguments on a parser, calls or passes `print`, or writes to sys.stdout / sys.stderr;
progress lines go through jaxpos.progress, whose `status` is the one print allowed. Imports inside functions say
why they are lazy, and the command line starts without jax."""

import ast
import io
import os
import re
import subprocess
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "jaxpos")
CLI = os.path.join(PACKAGE, "cli")
ALLOWED = {("progress.py", "status", "print")}  # the plain line under every bar and status message
PARSER_METHODS = {"add_subparsers", "add_parser", "add_argument", "add_mutually_exclusive_group", "parse_args",
                  "parse_known_args"}


class ConsoleUse(ast.NodeVisitor):
    """Collects (function, what, line) for each argparse import or parser method call, use of `print` and
    sys.stdout/stderr write."""

    def __init__(self):
        self.functions, self.found = [], []

    def _note(self, what: str, node: ast.AST) -> None:
        self.found.append((self.functions[-1] if self.functions else "", what, node.lineno))

    def _function(self, node) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Import(self, node: ast.Import) -> None:
        if any(alias.name.split(".")[0] == "argparse" for alias in node.names):
            self._note("import argparse", node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if (node.module or "").split(".")[0] == "argparse":
            self._note("import argparse", node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr in PARSER_METHODS:
            self._note(f".{node.func.attr}()", node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "print":  # a call, or print handed on as a callback
            self._note("print", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        target = node.value
        if (node.attr in ("write", "writelines") and isinstance(target, ast.Attribute)
                and target.attr in ("stdout", "stderr") and isinstance(target.value, ast.Name)
                and target.value.id == "sys"):
            self._note(f"sys.{target.attr}.{node.attr}", node)
        self.generic_visit(node)


def console_uses(path: str) -> list[tuple[str, str, int]]:
    with open(path, encoding="utf-8") as f:
        visitor = ConsoleUse()
        visitor.visit(ast.parse(f.read(), path))
    return visitor.found


def package_modules() -> list[tuple[str, str]]:
    """(path, path relative to jaxpos/) of every module of the package, in a stable order."""
    return [(os.path.join(root, name), os.path.relpath(os.path.join(root, name), PACKAGE))
            for root, _, files in sorted(os.walk(PACKAGE)) for name in sorted(files) if name.endswith(".py")]


def test_only_the_command_line_parses_arguments_or_prints():
    offences = []
    for path, relative in package_modules():
        if os.path.commonpath([path, CLI]) == CLI:
            continue
        offences += [f"jaxpos/{relative}:{line} {what} (in {function or 'the module'})"
                     for function, what, line in console_uses(path)
                     if (relative, function, what) not in ALLOWED]
    assert not offences, "\n".join(offences)


def test_the_scan_sees_what_it_forbids(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import argparse\nfrom argparse import Namespace\nimport sys\n\n\ndef report(log=print):\n"
                      "    print('x')\n    sys.stdout.write('y')\n    sys.stderr.writelines(['z'])\n\n\n"
                      "def register(subparsers):\n    subparsers.add_parser('go').add_argument('--x')\n")
    assert console_uses(str(source)) == [("", "import argparse", 1), ("", "import argparse", 2),
                                         ("report", "print", 6), ("report", "print", 7),
                                         ("report", "sys.stdout.write", 8), ("report", "sys.stderr.writelines", 9),
                                         ("register", ".add_argument()", 13), ("register", ".add_parser()", 13)]


def imported_modules(path: str) -> set[str]:
    """The jaxpos modules a file imports, at any depth (function-level imports included)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update([node.module] + [f"{node.module}.{alias.name}" for alias in node.names])
    return {n for n in names if n.split(".")[0] == "jaxpos"}


def test_the_command_line_and_the_workflows_are_imported_only_from_above():
    """jaxpos.cli is the top; jaxpos.workflows sits below it and jaxpos.reproduction only."""
    above = {"cli": ("cli",), "workflows": ("cli", "workflows", "reproduction")}
    offences = []
    for path, relative in package_modules():
        top = relative.split(os.sep)[0].removesuffix(".py")
        for module in sorted(imported_modules(path)):
            parts = module.split(".")
            if len(parts) > 1 and parts[1] in above and top not in above[parts[1]]:
                offences.append(f"{relative} imports {module}")
    assert not offences, "\n".join(offences)


def lazy_imports(path: str) -> list[tuple[str, str, bool]]:
    """(function, imported module, explained) for each import inside a function of the file at `path`;
    explained: a comment, not only a lint directive, on one of its lines or on the line above it."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    comments = {}  # line -> (comment text, the line holds nothing else)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.string, not token.line[:token.start[1]].strip())

    def says_why(line: int, alone: bool = False) -> bool:
        text, only = comments.get(line, ("", False))
        reason = re.sub(r"#\s*(noqa(:\s*[\w, ]+)?|type:\s*ignore\S*)", "", text).strip("# -")
        return bool(reason) and (only or not alone)

    found = []
    for function in ast.walk(ast.parse(source, path)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                explained = (says_why(node.lineno - 1, alone=True)
                             or any(says_why(line) for line in range(node.lineno, node.end_lineno + 1)))
                for module in ([node.module] if isinstance(node, ast.ImportFrom) else
                               [alias.name for alias in node.names]):
                    found.append((function.name, module, explained))
    return sorted(set(found))


def test_every_import_inside_a_function_says_why_it_is_lazy():
    """Imports sit at the top of their module unless start-up time needs them later (a command that loads no jax,
    an optional package that only some paths read); those say why, on their line or the line above."""
    unexplained = []
    for path, relative in package_modules():
        unexplained += [f"jaxpos/{relative}: {function} imports {module} without a reason"
                        for function, module, explained in lazy_imports(path) if not explained]
    assert not unexplained, "\n".join(unexplained)


def test_the_lazy_import_scan_sees_reasons(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("def f():\n    import a  # lazy: slow\n    # lazy: slower\n    import b\n    import c\n"
                      "    import d  # noqa: F401\n    x = 1  # a comment on code\n    from e import (g,\n"
                      "                   h)  # lazy: big\n")
    assert lazy_imports(str(source)) == [("f", "a", True), ("f", "b", True), ("f", "c", False), ("f", "d", False),
                                         ("f", "e", True)]


def test_the_command_line_starts_without_jax():
    """`jaxpos --help` and argument errors stay fast: the command modules import their workflows when they run."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, jaxpos.cli; print(*sorted(m for m in ('jax', 'numpy', 'ml_collections', "
                               "'etils', 'matplotlib') if m in sys.modules))"],
        capture_output=True, text=True, check=True, cwd=os.path.dirname(PACKAGE)).stdout.split()
    assert loaded == []
