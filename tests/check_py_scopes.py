#!/usr/bin/env python3
"""tests/check_py_scopes.py: find function-local imports that make a name local too early.

Python decides at compile time that a name bound anywhere in a function (an `import`
included) is local to the WHOLE function. So

    def main():
        if not torch.cuda.is_available(): ...   # UnboundLocalError here
        import torch._dynamo                     # binds `torch` in main()

fails at its first line although `torch` is imported at module level (issue 19:
the former tools/bench_torch_fsdp2.py died so on the GPU machine, where torch exists; here, without
torch, nothing ever ran it). Flagged, per function (nested functions and classes are
their own scopes; comprehensions and lambdas read the function's locals, so they count):

  1. a read of a name before the function-local import that binds it, in source order;
  2. a function-local import inside an `if`/`for`/`while`/`with`/`match` block, of a name
     the function also reads outside that block (unbound when the block did not run).

`import a.b` binds `a`; `import a.b as c` and `from a import b as c` bind `c`. Names the
function declares `global` or `nonlocal` are skipped. Standard library only, so it runs in
CI without torch: `check_py_scopes.py PATH...` (files, or folders searched for *.py) prints
one line per finding, `file:line: ...`, and exits 1 if there is any; `--self-test` first
checks the rules on known-bad and known-good snippets (a checker that cannot fail is no
test).
"""
import ast
import os
import sys

BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith) + \
    ((ast.Match,) if hasattr(ast, "Match") else ())


def import_bindings(node):
    """Names an Import / ImportFrom statement binds in its scope."""
    for a in node.names:
        if a.name == "*":
            continue
        if a.asname:
            yield a.asname
        elif isinstance(node, ast.Import):
            yield a.name.split(".")[0]
        else:
            yield a.name


def scope_nodes(fn):
    """(node, enclosing blocks) for every node of fn's own scope, in source order; nested
    functions, classes and lambdas are not entered (lambdas are entered: they only read)."""
    out = []

    def walk(node, blocks):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # Decorators and defaults are evaluated in fn's scope; the body is not.
                for d in child.decorator_list:
                    out.append((d, blocks)); walk(d, blocks)
                continue
            inner = blocks + [child] if isinstance(child, BLOCKS) else blocks
            out.append((child, blocks))
            walk(child, inner)

    walk(fn, [])
    return out


def check_function(fn, path):
    nodes = scope_nodes(fn)
    declared = set()
    for n, _ in nodes:
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            declared.update(n.names)
    imports = {}  # name -> (import node, its enclosing blocks), first in source order
    for n, blocks in nodes:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for name in import_bindings(n):
                if name not in declared and name not in imports:
                    imports[name] = (n, blocks)
    found = []
    for name, (imp, blocks) in imports.items():
        what = "`%s`" % ast.unparse(imp) if hasattr(ast, "unparse") else "an import"
        reads = [n for n, _ in nodes
                 if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        early = [r for r in reads if (r.lineno, r.col_offset) < (imp.lineno, imp.col_offset)]
        if early:
            found.append("%s:%d: '%s' is read in %s() before %s at line %d binds it there: the "
                         "import makes '%s' local to the whole function (UnboundLocalError); import "
                         "at module level, or bind another name (`import a.b as c`)"
                         % (path, early[0].lineno, name, getattr(fn, "name", "<lambda>"), what,
                            imp.lineno, name))
            continue
        if blocks:
            outer = blocks[0]
            end = getattr(outer, "end_lineno", None)
            outside = [r for r in reads if end is not None and not (outer.lineno <= r.lineno <= end)]
            if outside:
                found.append("%s:%d: '%s' is read in %s() outside the %s block (line %d) whose %s "
                             "binds it: unbound when the block does not run; import at module level "
                             "or at the top of the function"
                             % (path, outside[0].lineno, name, fn.name, type(outer).__name__.lower(),
                                outer.lineno, what))
    return found


def check_source(src, path):
    tree = ast.parse(src, filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += check_function(node, path)
    return found


def py_files(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".git"))
                for f in sorted(files):
                    if f.endswith(".py"):
                        yield os.path.join(root, f)
        else:
            yield p


SELF_TEST = {
    # issue 19's bug: a read before the local import
    "bad_read_before": ("import torch\ndef main():\n    if not torch.cuda.is_available():\n"
                        "        return 1\n    import torch._dynamo\n    return 0\n", 1),
    # the import only runs in a branch; the read after the branch fails when it is skipped
    "bad_conditional": ("import torch\ndef main(c):\n    if c:\n        import torch._dynamo\n"
                        "        torch._dynamo.reset()\n    return torch.ones(1)\n", 1),
    "bad_in_comprehension": ("import os\ndef f(xs):\n    ys = [os.path.basename(x) for x in xs]\n"
                             "    import os.path\n    return ys\n", 1),
    "good_module_level": ("import torch\nimport torch._dynamo\ndef main():\n"
                          "    torch._dynamo.reset()\n    return torch.ones(1)\n", 0),
    "good_alias": ("import torch\ndef main(c):\n    x = torch.ones(1)\n    if c:\n"
                   "        import torch._dynamo as dynamo\n        dynamo.reset()\n    return x\n", 0),
    "good_top_of_function": ("def main():\n    import json\n    return json.dumps(1)\n", 0),
    "good_nested_scope": ("import torch\ndef outer():\n    x = torch.ones(1)\n    def inner():\n"
                          "        import torch\n        return torch.zeros(1)\n    return x, inner\n", 0),
    "good_inside_block_only": ("def f(c):\n    if c:\n        import json\n        return json.dumps(c)\n"
                               "    return None\n", 0),
}


def self_test():
    bad = []
    for name, (src, want) in SELF_TEST.items():
        got = len(check_source(src, "<" + name + ">"))
        if got != want:
            bad.append("%s: %d finding(s), expected %d" % (name, got, want))
    for b in bad:
        print("check_py_scopes.py: self-test failed: " + b, file=sys.stderr)
    return not bad


def main(argv):
    args = argv[1:]
    if args and args[0] == "--self-test":
        if not self_test():
            return 1
        print("check_py_scopes.py: self-test: %d snippets classified as expected" % len(SELF_TEST))
        args = args[1:]
    if not args:
        print("usage: check_py_scopes.py [--self-test] PATH...", file=sys.stderr)
        return 2
    found, n = [], 0
    for f in py_files(args):
        n += 1
        with open(f, encoding="utf-8") as fh:
            src = fh.read()
        try:
            found += check_source(src, f)
        except SyntaxError as e:
            found.append("%s:%s: syntax error: %s" % (f, e.lineno, e.msg))
    for line in found:
        print(line)
    print("check_py_scopes.py: %d file(s), %d finding(s)" % (n, len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
