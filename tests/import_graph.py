"""Static import graph of the project's packages, read with `ast` (no import).

`graph(root, packages)` maps every module of `packages` (dotted names) to the
project modules it imports, at module level or inside functions, with
relative imports and `from pkg import module` resolved; `cycles(graph)` lists
each import circle once. Used by tests/test_imports.py; runs without JAX.
"""
import ast
import dataclasses
import pathlib


@dataclasses.dataclass(frozen=True)
class Edge:
  """One import statement: `source` imports `target` at `source`:`line`."""
  source: str
  target: str
  line: int
  nested: bool  # inside a function or class body (a deferred import)


def modules(root: pathlib.Path, packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py file under `packages`."""
  found = {}
  for package in packages:
    for path in sorted((root / package).rglob("*.py")):
      parts = list(path.relative_to(root).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      found[".".join(parts)] = path
  return found


def _is_package(name: str, known: dict[str, pathlib.Path]) -> bool:
  return known[name].name == "__init__.py"


def _resolve_base(module: str, level: int, target: str | None,
                  known: dict[str, pathlib.Path]) -> str:
  """Absolute dotted name of an `import`/`from` base, relative ones resolved."""
  if level == 0:
    return target or ""
  package = module if _is_package(module, known) else module.rpartition(".")[0]
  for _ in range(level - 1):
    package = package.rpartition(".")[0]
  return f"{package}.{target}" if target else package


def _owner(name: str, known: dict[str, pathlib.Path]) -> str | None:
  """The longest known module that `name` is or lies in, else None."""
  while name:
    if name in known:
      return name
    name = name.rpartition(".")[0]
  return None


def _targets(module: str, node: ast.AST,
             known: dict[str, pathlib.Path]) -> list[str]:
  """Project modules that one import statement loads."""
  found = []
  if isinstance(node, ast.Import):
    for alias in node.names:
      owner = _owner(alias.name, known)
      if owner:
        found.append(owner)
  elif isinstance(node, ast.ImportFrom):
    base = _resolve_base(module, node.level, node.module, known)
    owner = _owner(base, known)
    if owner is None:
      return []
    for alias in node.names:
      sub = f"{base}.{alias.name}"
      # `from pkg import module` loads the submodule; `from pkg import name`
      # (or `*`) reads pkg's own namespace.
      found.append(sub if sub in known else owner)
  return found


def _walk(tree: ast.AST):
  """Yields (import node, nested) for every import in `tree`."""
  stack = [(tree, False)]
  while stack:
    node, nested = stack.pop()
    for child in ast.iter_child_nodes(node):
      inner = nested or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                  ast.ClassDef))
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        yield child, nested
      stack.append((child, inner))


def _with_packages(module: str, target: str,
                   known: dict[str, pathlib.Path]) -> list[str]:
  """`target` and the packages whose __init__ importing it runs first, less
  those `module` lies in (already being imported when it runs)."""
  out, name = [target], target.rpartition(".")[0]
  while name:
    if name in known and not (module + ".").startswith(name + "."):
      out.append(name)
    name = name.rpartition(".")[0]
  return out


def edges(root: pathlib.Path, packages: tuple[str, ...]) -> list[Edge]:
  """Every project-internal import of `packages` (the packages a target
  lies in included), self-imports left out."""
  known = modules(root, packages)
  found = set()
  for module, path in known.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    for node, nested in _walk(tree):
      for target in _targets(module, node, known):
        for name in _with_packages(module, target, known):
          if name != module:
            found.add(Edge(module, name, node.lineno, nested))
  return sorted(found, key=lambda e: (e.source, e.line, e.target))


def external(root: pathlib.Path, packages: tuple[str, ...]) -> list[tuple[str, int, str]]:
  """(module, line, top-level name) of every absolute import outside the
  project modules of `packages`."""
  known = modules(root, packages)
  found = []
  for module, path in known.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    for node, _ in _walk(tree):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
      else:
        continue
      for name in names:
        if _owner(name, known) is None:
          found.append((module, node.lineno, name.split(".")[0]))
  return found


def cycles(all_edges: list[Edge]) -> list[list[Edge]]:
  """One shortest circle per strongly connected component's each edge.

  Each circle is a list of edges a -> b -> ... -> a, rotated to start at its
  smallest module name; duplicates are dropped."""
  graph: dict[str, dict[str, Edge]] = {}
  for e in all_edges:
    graph.setdefault(e.source, {}).setdefault(e.target, e)
  found = {}
  for e in all_edges:
    path = _shortest_path(graph, e.target, e.source)
    if path is None:
      continue
    circle = [e] + path
    start = min(range(len(circle)), key=lambda i: circle[i].source)
    circle = circle[start:] + circle[:start]
    found.setdefault(tuple(c.source for c in circle), circle)
  return [found[k] for k in sorted(found)]


def _shortest_path(graph, start: str, goal: str) -> list[Edge] | None:
  """Breadth-first edges from `start` to `goal`, or None."""
  if start == goal:
    return []
  previous = {start: None}
  frontier = [start]
  while frontier:
    following = []
    for node in frontier:
      for nxt, e in sorted(graph.get(node, {}).items()):
        if nxt in previous:
          continue
        previous[nxt] = e
        if nxt == goal:
          path = []
          while e is not None:
            path.append(e)
            e = previous[e.source]
          return path[::-1]
        following.append(nxt)
    frontier = following
  return None


def describe(circle: list[Edge]) -> str:
  """One readable line: a:12 -> b:40 (in a function) -> a."""
  steps = []
  for e in circle:
    where = f"{e.source}:{e.line}"
    steps.append(where + (" (in a function)" if e.nested else ""))
  return " -> ".join(steps + [circle[0].source])
