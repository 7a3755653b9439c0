"""The MkDocs hook that generates the reference pages from the code at build time, so no
page can drift from what it describes:

- ``reference/cli.md`` from the Typer app's commands, arguments and options;
- ``reference/http.md`` from the server's OpenAPI document;
- ``reference/event-types.md`` from the registered event classes;
- ``images/inspector/*.png``, the screenshots ``make docs`` takes first (``screenshots.py``).

It also fails the build when a name of ``contextfold.__all__`` has no ``::: contextfold.NAME``
entry in the Python API pages: a new public name needs its reference.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import typer.main
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from pydantic.fields import FieldInfo
from roles import plain_roles  # beside this file (MkDocs puts a hook's folder on sys.path)

import contextfold
from contextfold.cli import app
from contextfold.events import Event, registered_types
from contextfold.server.body import DEFAULT_MAX_BODY_BYTES
from contextfold.server.openapi import openapi_schema

__all__ = [
    "SCREENSHOTS",
    "cli_page",
    "event_types_page",
    "http_page",
    "missing_api_names",
    "on_files",
]

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "docs-screenshots"
"""Where ``screenshots.py`` leaves the inspector's pictures (``make docs`` runs it first)."""
_SHOTS = ("trace.png", "request-diff.png", "verify.png")
_GENERATED_NOTE = "<!-- Generated at build time by docs/_hooks/reference.py: edit the code. -->\n"


def _cell(text: str) -> str:
    """``text`` fit for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


# --- the CLI, from the Typer app ---


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    yield command, ctx
    for name in getattr(command, "commands", {}):
        sub = command.commands[name]
        if not sub.hidden:
            yield from _commands(sub, sub.context_class(sub, info_name=name, parent=ctx))


def _option_row(param: Any, ctx: Any) -> str:
    # The help record is what ``--help`` prints for the parameter: names, metavar, help text
    # with its default, environment variable and range.
    names, meaning = param.get_help_record(ctx)
    return f"| `{names}` | {_cell(meaning)} |"


def cli_page() -> str:
    """The CLI reference: every command's usage, help and parameters."""
    root = typer.main.get_command(app)
    lines = [
        _GENERATED_NOTE,
        "# CLI",
        "",
        "Every command of `contextfold`, as `contextfold COMMAND --help` prints it. The read "
        "commands open the journal read-only; a mistake is one line on stderr and exit "
        "status 1. The how-to on [the server and inspector](../how-to/server.md) shows them "
        "at work.",
        "",
    ]
    for command, ctx in _commands(root, root.context_class(root, info_name="contextfold")):
        path = ctx.command_path
        lines += [f"## `{path}`", ""]
        lines += [command.help.strip() if command.help else "", ""]
        lines += ["```text", command.get_usage(ctx), "```", ""]
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        if params:
            lines += ["| argument or option | meaning |", "|---|---|"]
            lines += [_option_row(p, ctx) for p in params]
            lines.append("")
    return "\n".join(lines)


# --- the HTTP API, from the OpenAPI document ---


def _schema_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: Mapping[str, Any]) -> str:
    """A short Markdown rendering of a JSON schema's type (schemas link to their section)."""
    if "$ref" in schema:
        name = _schema_name(schema["$ref"])
        return f"[{name}](#schema-{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(option) for option in schema[key])
    if "const" in schema:
        return f"`{schema['const']!r}`"
    if "enum" in schema:
        return " or ".join(f"`{value!r}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return str(kind)


def _constraints(schema: Mapping[str, Any]) -> str:
    shown = []
    for key in ("minimum", "maximum", "minLength", "maxLength", "default"):
        if key in schema:
            shown.append(f"{key} {schema[key]}")
    pattern = schema.get("pattern", "")
    if pattern and len(pattern) <= 40:
        shown.append(f"pattern `{pattern}`")
    return "; ".join(shown)


def _operation(path: str, method: str, op: Mapping[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    for key in ("summary", "description"):
        if op.get(key):
            lines += [op[key], ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            extra = _constraints(schema)
            meaning = _cell(p.get("description", "") + (f" ({extra})" if extra else ""))
            required = " (required)" if p.get("required") else ""
            lines.append(f"| `{p['name']}`{required} | {p['in']} | {_type(schema)} | {meaning} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body ({media}): {_type(content.get('schema', {}))}.", ""]
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        bodies = [
            f"{_type(c.get('schema', {}))} ({media})"
            for media, c in response.get("content", {}).items()
        ]
        lines.append(
            f"| {status} | {_cell(response.get('description', ''))} | {', '.join(bodies)} |"
        )
    return [*lines, ""]


def _schema_section(name: str, schema: Mapping[str, Any]) -> list[str]:
    lines = [f"### {name} {{#schema-{name.lower()}}}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    properties: Mapping[str, Any] = schema.get("properties", {})
    if not properties:
        return [*lines, f"Type: {_type(schema)}.", ""]
    required = set(schema.get("required", ()))
    lines += ["| field | type | meaning |", "|---|---|---|"]
    for field, sub in properties.items():
        mark = " (required)" if field in required else ""
        meaning = _cell(sub.get("description", "") or sub.get("title", ""))
        lines.append(f"| `{field}`{mark} | {_type(sub)} | {meaning} |")
    return [*lines, ""]


def http_page() -> str:
    """The HTTP reference: every route of ``contextfold serve`` and every body schema."""
    doc = openapi_schema(max_body_bytes=DEFAULT_MAX_BODY_BYTES, authenticated=True, namespaced=True)
    lines = [
        _GENERATED_NOTE,
        "# HTTP API",
        "",
        doc["info"].get("description", ""),
        "",
        "This page is generated from the OpenAPI 3.1 document the server serves at "
        "`/openapi.json`, as it is with a bearer token and a namespace allow-list: 401 "
        "answers only when the server has a token, 403 only when it serves some "
        "namespaces. The how-to on [the server and inspector](../how-to/server.md) says "
        "how to run it.",
        "",
        "## Routes",
        "",
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            lines += _operation(path, method, op)
    lines += ["## Schemas", ""]
    for name, schema in doc["components"]["schemas"].items():
        lines += _schema_section(name, schema)
    return "\n".join(lines)


# --- the event types, from the registry ---


def _import_everything() -> None:
    """Import every module of the package, so every event class is registered (the
    integrations need their extras, which ``make install`` installs)."""
    for module in pkgutil.walk_packages(contextfold.__path__, "contextfold."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)


def _annotation(info: FieldInfo) -> str:
    shown = inspect.formatannotation(info.annotation)
    return re.sub(r"\b(?:[a-z_]+\.)+([A-Za-z_])", r"\1", shown)


def _event_section(name: str, cls: type[Event]) -> list[str]:
    lines = [f"### `{name}`", ""]
    where = f"`{cls.__module__}.{cls.__qualname__}`"
    runtime = " Runtime-only: HTTP writers are refused it." if cls.runtime_only else ""
    lines += [f"Class {where}.{runtime}", ""]
    doc = inspect.getdoc(cls) if cls.__doc__ else None
    if doc:
        lines += [doc.split("\n\n", 1)[0].strip(), ""]
    fields = cls.model_fields
    if fields:
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for field, info in fields.items():
            default = "required" if info.is_required() else f"`{info.get_default()!r}`"
            meaning = _cell(info.description or "")
            lines.append(f"| `{field}` | `{_cell(_annotation(info))}` | {default} | {meaning} |")
        lines.append("")
    return lines


def event_types_page() -> str:
    """The event types reference: every event class contextfold registers, by owner."""
    _import_everything()
    owned = {
        name: cls
        for name, cls in registered_types().items()
        if cls.__module__.startswith("contextfold.")
        and not cls.__module__.startswith("contextfold.examples")
    }
    lines = [
        _GENERATED_NOTE,
        "# Event types",
        "",
        "Every event type contextfold itself writes, as `contextfold.events.registered_types()` "
        "lists them once every module is imported, grouped by the module that defines them. "
        "The type name, not the class, is what the journal stores. A runtime-only type is "
        "written by the agent runtime or an integration: the HTTP server refuses it from "
        "external writers (see [trust and external actors](../how-to/trust.md)).",
        "",
    ]
    modules = sorted({cls.__module__ for cls in owned.values()})
    for module in modules:
        lines += [f"## `{module}`", ""]
        for name, cls in sorted(owned.items()):
            if cls.__module__ == module:
                lines += _event_section(name, cls)
    return "\n".join(lines)


# --- the Python API's completeness ---


def missing_api_names(pages: Path) -> list[str]:
    """The names of ``contextfold.__all__`` that no ``::: contextfold.NAME`` line documents
    in the Markdown files under ``pages``."""
    documented = {
        match
        for page in pages.rglob("*.md")
        for match in re.findall(r"^::: contextfold\.(\w+)\s*$", page.read_text(), flags=re.M)
    }
    return sorted(set(contextfold.__all__) - documented)


# --- the MkDocs hook ---


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    """Add the generated pages and the screenshots; fail on an undocumented public name."""
    missing = missing_api_names(Path(config.docs_dir) / "reference" / "python")
    if missing:
        raise PluginError(
            "public names without a reference entry (add `::: contextfold.NAME` to a page "
            f"under docs/reference/python/): {', '.join(missing)}"
        )
    for uri, content in (
        ("reference/cli.md", cli_page()),
        ("reference/http.md", http_page()),
        ("reference/event-types.md", event_types_page()),
    ):
        # Schema and event descriptions are docstrings: their Sphinx roles become code spans.
        files.append(File.generated(config, uri, content=plain_roles(content)))
    absent = [name for name in _SHOTS if not (SCREENSHOTS / name).is_file()]
    if absent:
        raise PluginError(
            f"the inspector screenshots {', '.join(absent)} are missing from {SCREENSHOTS}: "
            "`make docs` takes them (python -m docs._hooks.screenshots build/docs-screenshots)"
        )
    for name in _SHOTS:
        shot = File.generated(
            config, f"images/inspector/{name}", abs_src_path=str(SCREENSHOTS / name)
        )
        files.append(shot)
    return files
