"""The stub files and the public functions agree with the table of collectives (src/ops.rs, seen
from Python as ``_symm.COLLECTIVES``), so that neither can drift from it."""

import ast
import inspect
import pathlib

import symm
from symm import _symm

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "symm"


def functions(name):
    tree = ast.parse((PACKAGE / name).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def parameters(args):
    """Names and defaults (as normalised source) of a stub's parameter list."""
    return [a.arg for a in args.args], [ast.unparse(d) for d in args.defaults]


def test_the_stubs_and_signatures_of_the_collectives_follow_the_table():
    public, native = functions("__init__.pyi"), functions("_symm.pyi")
    table = {row[0]: row for row in _symm.COLLECTIVES}
    assert len(table) == len(_symm.COLLECTIVES) >= 8, _symm.COLLECTIVES
    # Every collective the native stub declares is in the table, and the other way round.
    assert {n for n in native if n.startswith("shmem_")} == set(table), sorted(native)
    for function, _kind, names, defaults, stub in _symm.COLLECTIVES:
        defaults = [ast.unparse(ast.parse(d, mode="eval").body) for d in defaults]
        for stubs in (public, native):
            assert parameters(stubs[function].args) == (names, defaults), (function, ast.unparse(stubs[function]))
        # The public stub's parameter list is the table's, annotations included.
        want = ast.parse(f"def f({stub}): ...").body[0].args
        assert ast.unparse(public[function].args) == ast.unparse(want), (function, ast.unparse(public[function].args))
        # And so is the signature Python shows (the binding's text signature).
        f = getattr(symm, function)
        assert f is getattr(_symm, function)
        sig = list(inspect.signature(f).parameters.values())
        assert [p.name for p in sig] == names, (function, sig)
        shown = [repr(p.default) for p in sig if p.default is not inspect.Parameter.empty]
        assert shown == [repr(ast.literal_eval(d)) for d in defaults], (function, sig)
