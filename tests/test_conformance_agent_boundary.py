"""Boundary tests that walk the shipped source: no agent definition implements shared pipeline
behaviour (spec guardrails: Uniformity is the point, R-132).

Two walks over every shipped Python module:

* an *agent definition module* (one that builds ``AgentDefinition`` values or implements the
  ``kaizen_register_agents`` hook) holds data and the registration hook only: no functions,
  classes or lambdas of its own, no other hook, no import of pipeline code, and definitions
  that use only the domain-specific fields (id, name, mode, persona, tool grant, knowledge scope);
* shared pipeline code never branches on which agent is running (an agent id compared with a
  literal), so no agent gets a quietly different pipeline through a special case.

Each checker is run against a synthetic offender first, so the walk is known to be able to
fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.agents import AgentDefinition

REPO = Path(__file__).resolve().parents[1]
SHIPPED = (REPO / "kaizen_server_extension", REPO / "kaizen_kernel",
           REPO / "plugins" / "kaizen_plugins")
# The one hook an agent definition module implements; the spec declaring it is not one.
AGENT_HOOK = "kaizen_register_agents"
HOOKSPECS = REPO / "kaizen_server_extension" / "tools" / "hookspecs.py"
# Persona, mode, capability/tool grant, knowledge scope: what an agent may declare (and its
# identity); spec: What an agent is.
DOMAIN_FIELDS = frozenset({"agent_id", "name", "mode", "persona", "tool_ceiling",
                           "knowledge_scope"})
# What an agent definition module may import: the definition type and the hook machinery.
ALLOWED_IMPORTS = {
    "__future__": None,
    "kaizen_server_extension.agents": {"AgentDefinition"},
    "kaizen_server_extension.tools": {"hookimpl"},
    "kaizen_server_extension.tools.hookspecs": {"Registrar"},
}
# Expressions naming the running agent; compared with a literal they special-case one agent.
AGENT_IDENTITY = frozenset({"agent_id", "agent_version_id"})


def _shipped_modules() -> Iterator[tuple[str, str]]:
    for root in SHIPPED:
        for path in sorted(root.rglob("*.py")):
            if "migrations" in path.parts or "node_modules" in path.parts:
                continue
            yield str(path.relative_to(REPO)), path.read_text(encoding="utf-8")


def _is_agent_definition_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id == "AgentDefinition")
        or (isinstance(node.func, ast.Attribute) and node.func.attr == "AgentDefinition"))


def is_agent_definition_module(tree: ast.Module) -> bool:
    return any(_is_agent_definition_call(n) for n in ast.walk(tree)) or any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == AGENT_HOOK
        and any(_decorator_name(d) == "hookimpl" for d in n.decorator_list)
        for n in tree.body)


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_literal_data(node: ast.expr) -> bool:
    """Constants, and tuples/lists/sets/dicts of them, strings joined by implicit concat."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return all(_is_literal_data(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _is_literal_data(k) for k in node.keys) and all(
            _is_literal_data(v) for v in node.values)
    return False


def _definition_violations(call: ast.Call, where: str) -> list[str]:
    problems = []
    if call.args:
        problems.append(f"{where}: AgentDefinition takes keyword data only")
    for keyword in call.keywords:
        if keyword.arg not in DOMAIN_FIELDS:
            problems.append(f"{where}: field {keyword.arg!r} is not domain-specific agent data")
        elif not _is_literal_data(keyword.value):
            problems.append(f"{where}: field {keyword.arg!r} is computed, not declared data")
    return problems


def _register_body_violations(func: ast.FunctionDef | ast.AsyncFunctionDef,
                              where: str) -> list[str]:
    """The hook only hands definitions to ``register``: ``register(NAME)`` statements."""
    params = [a.arg for a in func.args.args]
    problems = []
    for index, statement in enumerate(func.body):
        if index == 0 and isinstance(statement, ast.Expr) \
                and isinstance(statement.value, ast.Constant):
            continue  # docstring
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id in params and len(call.args) == 1 and not call.keywords
                and (isinstance(call.args[0], ast.Name)
                     or _is_agent_definition_call(call.args[0]))):
            problems.append(f"{where}: line {statement.lineno}: the registration hook does "
                            "more than register definitions")
    return problems


def agent_module_violations(name: str, source: str) -> list[str]:
    """Why ``source`` is more than agent data plus its registration hook (empty: it is not)."""
    tree = ast.parse(source, filename=name)
    problems: list[str] = []
    for index, statement in enumerate(tree.body):
        where = f"{name}:{statement.lineno}"
        if index == 0 and isinstance(statement, ast.Expr) \
                and isinstance(statement.value, ast.Constant):
            continue  # module docstring
        if isinstance(statement, ast.ImportFrom):
            allowed = ALLOWED_IMPORTS.get(statement.module or "", set())
            names = {alias.name for alias in statement.names}
            if statement.module not in ALLOWED_IMPORTS or (
                    allowed is not None and not names <= allowed):
                problems.append(f"{where}: imports {statement.module}: {sorted(names)}")
        elif isinstance(statement, ast.Import):
            problems.append(f"{where}: imports {[a.name for a in statement.names]}")
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            value = statement.value
            if value is None or not (_is_agent_definition_call(value)
                                     or _is_literal_data(value)):
                problems.append(f"{where}: a module-level value that is not agent data")
            elif isinstance(value, ast.Call):
                problems.extend(_definition_violations(value, where))
        elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            if statement.name != AGENT_HOOK:
                problems.append(f"{where}: defines behaviour {statement.name}()")
            else:
                problems.extend(_register_body_violations(statement, where))
        else:
            problems.append(f"{where}: {type(statement).__name__} is not agent data")
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda | ast.ClassDef):
            problems.append(f"{name}:{node.lineno}: defines behaviour "
                            f"({type(node).__name__})")
        if _is_agent_definition_call(node):
            assert isinstance(node, ast.Call)
            problems.extend(_definition_violations(node, f"{name}:{node.lineno}"))
    return sorted(set(problems))


def _names_agent(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in AGENT_IDENTITY
    if isinstance(node, ast.Attribute):
        return node.attr in AGENT_IDENTITY or (
            node.attr == "id" and isinstance(node.value, ast.Name)
            and "agent" in node.value.id.lower())
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in AGENT_IDENTITY
    return False


def _string_literals(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return bool(node.elts) and all(_string_literals(e) for e in node.elts)
    return False


def special_case_violations(name: str, source: str) -> list[str]:
    """Places where pipeline code compares the running agent's identity with a literal."""
    problems = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_agent(s) for s in sides) and any(_string_literals(s) for s in sides):
                problems.append(f"{name}:{node.lineno}: branches on a specific agent")
        if isinstance(node, ast.Match) and _names_agent(node.subject):
            problems.append(f"{name}:{node.lineno}: matches on a specific agent")
    return problems


# --- the checkers can fail --------------------------------------------------------------------

GOOD_AGENT_MODULE = '''"""Agents."""
from __future__ import annotations
from kaizen_server_extension.agents import AgentDefinition
from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar
A = AgentDefinition(agent_id="a", name="A", mode="chat", persona="p " "q",
                    tool_ceiling=("list_available_agents",))
@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register(A)
'''

BAD_AGENT_MODULES = {
    "its own roster tool": GOOD_AGENT_MODULE + (
        "\nasync def list_available_agents(ctx):\n    return {'agents': []}\n"),
    "a second hook": GOOD_AGENT_MODULE + (
        "\n@hookimpl\ndef kaizen_register_tools(register):\n    register(x)\n"),
    "pipeline imports": GOOD_AGENT_MODULE.replace(
        "from __future__ import annotations\n",
        "from __future__ import annotations\n"
        "from kaizen_server_extension.tools.pipeline import ToolPipeline\n"),
    "a class": GOOD_AGENT_MODULE + "\nclass Retry:\n    attempts = 9\n",
    "a computed persona": GOOD_AGENT_MODULE.replace('persona="p " "q"',
                                                    'persona=load_prompt()'),
    "a retry field": GOOD_AGENT_MODULE.replace('mode="chat"', 'mode="chat", retries=9'),
    "work in the hook": GOOD_AGENT_MODULE.replace(
        "    register(A)\n", "    patch_guardrails()\n    register(A)\n"),
    "a lambda": GOOD_AGENT_MODULE + "\nGROUNDING = (lambda text: text)\n",
}


def test_the_agent_module_walk_accepts_data_and_catches_behaviour() -> None:
    assert agent_module_violations("good.py", GOOD_AGENT_MODULE) == []
    assert is_agent_definition_module(ast.parse(GOOD_AGENT_MODULE))
    for label, source in BAD_AGENT_MODULES.items():
        assert agent_module_violations(f"{label}.py", source), label


def test_the_special_case_walk_catches_a_branch_on_one_agent() -> None:
    offenders = [
        "if agent.agent_id == 'search':\n    skip_grounding = True\n",
        "if run.agent_version_id in ('general@1', 'general@2'):\n    pass\n",
        "retries = 9 if agent.id != 'general' else 1\n",
        "if event['agent_id'] == 'analyst':\n    pass\n",
        "match agent.agent_id:\n    case 'search':\n        pass\n",
    ]
    for source in offenders:
        assert special_case_violations("x.py", source), source
    assert special_case_violations(
        "ok.py", "rows = [r for r in rows if r.agent_id == agent_id]\n") == []


# --- the shipped source -----------------------------------------------------------------------


@pytest.mark.rule("R-132")
def test_agent_definitions_in_the_shipped_source_are_data_only() -> None:
    agent_modules = {name: source for name, source in _shipped_modules()
                     if Path(REPO / name) != HOOKSPECS
                     and is_agent_definition_module(ast.parse(source))}
    # The walk found the first-party agents (a walk that finds nothing proves nothing).
    assert "plugins/kaizen_plugins/agents.py" in agent_modules, sorted(agent_modules)
    problems = [p for name, source in agent_modules.items()
                for p in agent_module_violations(name, source)]
    assert problems == []
    # And the definition type itself carries only the domain-specific fields, so a pipeline
    # knob cannot be added to agents without this test changing.
    assert set(AgentDefinition.model_fields) == DOMAIN_FIELDS


@pytest.mark.rule("R-132")
def test_shared_pipeline_code_never_special_cases_an_agent() -> None:
    scanned = 0
    problems: list[str] = []
    for name, source in _shipped_modules():
        scanned += 1
        problems.extend(special_case_violations(name, source))
    assert scanned > 50  # the walk covered the runtime, lanes, tools, policy, store, plugins
    assert problems == []
