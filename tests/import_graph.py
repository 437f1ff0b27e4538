"""Static import graph of the project's packages, read with `ast` (nothing
is imported, JAX included).

`edges(root, packages)`: every import of one project module by another, at
module level or inside a function, with relative imports, `from pkg import
module`, importlib calls with a literal name and the packages whose
__init__ an import runs resolved; `cycles(edges)`: the import circles, each
`describe`d as one line; `external(root, packages)`: what else they import;
`loaded(edges, starts)`: what importing some modules loads.
Used by tests/test_imports.py.
"""
import ast
import dataclasses
import functools
import pathlib


@dataclasses.dataclass(frozen=True)
class Edge:
  """One import statement: `source` imports `target` at `source`:`line`."""
  source: str
  target: str
  line: int
  nested: bool  # inside a function (run when called: a deferred import)


def modules(root: pathlib.Path,
            packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py file under `packages`."""
  found = {}
  for package in packages:
    for path in sorted((root / package).rglob("*.py")):
      parts = list(path.relative_to(root).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      found[".".join(parts)] = path
  return found


@functools.lru_cache(maxsize=None)
def _parse(path: pathlib.Path) -> ast.AST:
  return ast.parse(path.read_text(), filename=str(path))


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


def _dynamic(node: ast.AST) -> ast.Import | None:
  """`importlib.import_module("a.b")` / `__import__("a.b")` with a literal
  name, as the `import a.b` it amounts to (else None)."""
  if not (isinstance(node, ast.Call) and node.args
          and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)):
    return None
  f = node.func
  name = (f.attr if isinstance(f, ast.Attribute) else
          f.id if isinstance(f, ast.Name) else None)
  if name not in ("import_module", "__import__"):
    return None
  return ast.Import(names=[ast.alias(name=node.args[0].value)],
                    lineno=node.lineno)


def _walk(tree: ast.AST):
  """Yields (import node, nested) for every import in `tree`; nested: inside
  a function (run when called, not when the module is imported)."""
  stack = [(tree, False)]
  while stack:
    node, nested = stack.pop()
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        yield child, nested
      elif (dynamic := _dynamic(child)) is not None:
        yield dynamic, nested
      stack.append((child, nested or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))))


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
    for node, nested in _walk(_parse(path)):
      for target in _targets(module, node, known):
        for name in _with_packages(module, target, known):
          if name != module:
            found.add(Edge(module, name, node.lineno, nested))
  return sorted(found, key=lambda e: (e.source, e.line, e.target))


def external(root: pathlib.Path, packages: tuple[str, ...]) -> list[Edge]:
  """Every absolute import of something outside the modules of `packages`,
  its target the top-level name ('jax' for jax.numpy)."""
  known = modules(root, packages)
  found = []
  for module, path in known.items():
    for node, nested in _walk(_parse(path)):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
      else:
        continue
      for name in names:
        if _owner(name, known) is None:
          found.append(Edge(module, name.split(".")[0], node.lineno, nested))
  return found


def loaded(all_edges: list[Edge], starts: tuple[str, ...]) -> set[str]:
  """The modules importing `starts` loads: reached by module-level imports
  (those inside functions run only when called)."""
  graph: dict[str, set[str]] = {}
  for e in all_edges:
    if not e.nested:
      graph.setdefault(e.source, set()).add(e.target)
  found, frontier = set(starts), list(starts)
  while frontier:
    for nxt in graph.get(frontier.pop(), ()):
      if nxt not in found:
        found.add(nxt)
        frontier.append(nxt)
  return found


def _components(graph: dict[str, dict[str, Edge]]) -> list[set[str]]:
  """The strongly connected components of more than one module (Kosaraju:
  finishing order on the graph, then reached sets on the reversed one)."""
  order, seen = [], set()
  for root in sorted(graph):
    if root in seen:
      continue
    seen.add(root)
    stack = [(root, iter(sorted(graph.get(root, {}))))]
    while stack:
      node, todo = stack[-1]
      nxt = next(todo, None)
      if nxt is None:
        order.append(node)
        stack.pop()
      elif nxt not in seen:
        seen.add(nxt)
        stack.append((nxt, iter(sorted(graph.get(nxt, {})))))
  reverse: dict[str, set[str]] = {}
  for source, targets in graph.items():
    for target in targets:
      reverse.setdefault(target, set()).add(source)
  found, placed = [], set()
  for root in reversed(order):
    if root in placed:
      continue
    component, frontier = {root}, [root]
    placed.add(root)
    while frontier:
      for prev in reverse.get(frontier.pop(), ()):
        if prev not in placed:
          placed.add(prev)
          component.add(prev)
          frontier.append(prev)
    if len(component) > 1:
      found.append(component)
  return found


def cycles(all_edges: list[Edge]) -> list[list[Edge]]:
  """The import circles: for each group of modules that import each other,
  the shortest circle through each import inside a function (the deferred
  imports that keep a circle from failing at import time), or, with none,
  its shortest circle; each as edges a -> b -> ... -> a, rotated to start
  at its smallest module name. Empty exactly when there is no circle."""
  graph: dict[str, dict[str, Edge]] = {}
  for e in all_edges:
    graph.setdefault(e.source, {}).setdefault(e.target, e)
  found = {}
  for component in _components(graph):
    inside = [e for e in all_edges
              if e.source in component and e.target in component]
    through = [e for e in inside if e.nested] or inside
    circles = [[e] + _shortest_path(graph, e.target, e.source)
               for e in through]
    if not any(e.nested for e in inside):
      circles = [min(circles, key=len)]
    for circle in circles:
      start = min(range(len(circle)), key=lambda i: circle[i].source)
      circle = circle[start:] + circle[:start]
      found.setdefault(tuple((c.source, c.line) for c in circle), circle)
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
