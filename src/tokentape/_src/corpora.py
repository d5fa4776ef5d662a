"""Built-in corpora made from text every Python installation carries; nothing is downloaded.

Three sources, each a directory of input files the tokenizer reads:

- ``prose/`` (jsonl): ``topics.jsonl`` holds the language reference topics that ``help()``
  shows (``pydoc_data.topics``), one document per topic in key order;
  ``docstrings-NNN.jsonl`` hold, per standard-library module, its docstrings (module, classes,
  functions and methods) read from the source with ``ast`` (nothing is imported);
  ``zz-logdump.jsonl`` holds one planted pathological document, a log dump of one heartbeat
  line repeated 3,000 times (about a tenth of the source), that a repeated-line filter is
  expected to drop.
- ``code/`` (jsonl): standard-library ``.py`` files (tests, ``site-packages``, ``idlelib``,
  ``lib2to3`` and similar left out), one document per file in relative-path order, up to
  about 6 MB, in files ``part-NNN.jsonl`` of about 1 MB.
- ``notes/`` (txt): 20 reference topics, one ``.txt`` file (one document) each.

Every JSON line is ``{"id": ..., "text": ...}``. The output is a function of the Python
installation only: rerunning on the same installation rewrites byte-identical files. Each
file is written atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import ast
import json
import os
import re
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics as PYDOC_TOPICS

from tokentape._src.store.atomic import write_atomic
from tokentape._src.tokenize.filters import UniqueLines

DOCSTRING_BUDGET = 1_400_000  # bytes of docstring prose to collect
DOCSTRING_FILE_BYTES = 500_000  # target size of one docstrings-NNN.jsonl
CODE_BUDGET = 6_000_000  # bytes of source code to collect
CODE_FILE_BYTES = 1_000_000  # target size of one code/part-NNN.jsonl
CODE_MAX_FILE = 200_000  # larger source files are left out (a few generated tables)
MIN_DOCSTRING_TEXT = 200  # modules with less docstring text than this are left out
N_NOTES = 20

LOG_LINE = "Jan  1 00:00:00 web-01 healthd[812]: heartbeat ok"
LOG_REPEATS = 3_000

# Directories of the standard library that hold no ordinary library code.
EXCLUDED_DIRS = frozenset(
    {
        "__pycache__",
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "lib2to3",
        "pydoc_data",
        "turtledemo",
        "ensurepip",
        "encodings",
    }
)


@dataclass(frozen=True)
class Document:
    """One document of a built-in corpus."""

    id: str
    text: str

    def json_line(self) -> bytes:
        """The document as one jsonl line, UTF-8, keys in fixed order."""
        line = json.dumps({"id": self.id, "text": self.text}, ensure_ascii=False)
        return (line + "\n").encode("utf-8")


def describe_builtin_corpora() -> str:
    """Where the built-in corpora come from (the module docstring)."""
    return __doc__ or ""


def write_builtin_corpora(out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write the built-in corpora below ``out_dir``; return {source name: directory}."""
    root = Path(out_dir)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = {
        "prose": _prose_files(stdlib),
        "code": _code_files(stdlib),
        "notes": _notes_files(),
    }
    written: dict[str, Path] = {}
    for name, files in sources.items():
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        for filename, data in files.items():
            write_atomic(directory / filename, data)
        written[name] = directory
    return written


# --- what goes where


def _prose_files(stdlib: Path) -> dict[str, bytes]:
    files = {"topics.jsonl": _jsonl(topic_documents())}
    chunks = _split_jsonl(docstring_documents(stdlib), DOCSTRING_FILE_BYTES)
    files.update({f"docstrings-{i:03d}.jsonl": data for i, data in enumerate(chunks)})
    files["zz-logdump.jsonl"] = _jsonl([logdump_document()])
    return files


def _code_files(stdlib: Path) -> dict[str, bytes]:
    chunks = _split_jsonl(code_documents(stdlib), CODE_FILE_BYTES)
    return {f"part-{i:03d}.jsonl": data for i, data in enumerate(chunks)}


def _notes_files() -> dict[str, bytes]:
    return {f"{_safe_name(doc.id)}.txt": doc.text.encode("utf-8") for doc in note_documents()}


# --- documents


def topic_documents() -> list[Document]:
    """One document per ``help()`` topic of the language reference, in key order."""
    return [Document(f"topic/{key}", PYDOC_TOPICS[key]) for key in sorted(PYDOC_TOPICS)]


def note_documents() -> list[Document]:
    """``N_NOTES`` topics spread evenly over the sorted keys."""
    docs = topic_documents()
    n = min(N_NOTES, len(docs))
    return [docs[i * len(docs) // n] for i in range(n)]


def logdump_document() -> Document:
    """The planted pathological document: one log line repeated ``LOG_REPEATS`` times."""
    return Document("logdump/healthd", (LOG_LINE + "\n") * LOG_REPEATS)


def stdlib_sources(stdlib: Path) -> list[str]:
    """POSIX paths (relative to ``stdlib``) of library ``.py`` files, sorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and _is_package_dir(d)]
        for name in filenames:
            if name.endswith(".py"):
                rel = Path(dirpath, name).relative_to(stdlib)
                found.append(rel.as_posix())
    return sorted(found)


def _is_package_dir(name: str) -> bool:
    """Directories whose name could be a module name (skips config-3.x-..., etc.)."""
    return name.isidentifier()


def _read_source(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def code_documents(stdlib: Path) -> Iterator[Document]:
    """Library source files in path order, up to ``CODE_BUDGET`` bytes."""
    total = 0
    for rel in stdlib_sources(stdlib):
        path = stdlib / rel
        if path.stat().st_size > CODE_MAX_FILE:
            continue
        text = _read_source(path)
        if text is None or not text.strip() or UniqueLines().drops(text):
            continue
        yield Document(rel, text)
        total += len(text.encode("utf-8"))
        if total >= CODE_BUDGET:
            return


def docstring_documents(stdlib: Path) -> Iterator[Document]:
    """Per module, its docstrings joined by blank lines, up to ``DOCSTRING_BUDGET`` bytes."""
    total = 0
    for rel in stdlib_sources(stdlib):
        source = _read_source(stdlib / rel)
        if source is None:
            continue
        try:
            tree = ast.parse(source, filename=rel)
        except (SyntaxError, ValueError):
            continue
        text = "\n\n".join(_docstrings(tree))
        if len(text) < MIN_DOCSTRING_TEXT or UniqueLines().drops(text):
            continue
        yield Document(_module_name(rel), text)
        total += len(text.encode("utf-8"))
        if total >= DOCSTRING_BUDGET:
            return


def _docstrings(tree: ast.Module) -> list[str]:
    """The docstrings of a module, its classes, functions and methods, in source order."""
    found: list[str] = []
    doc = ast.get_docstring(tree)
    if doc:
        found.append(doc)
    _body_docstrings(tree.body, found)
    return found


def _body_docstrings(body: Sequence[ast.stmt], found: list[str]) -> None:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc:
                found.append(doc)
            if isinstance(node, ast.ClassDef):
                _body_docstrings(node.body, found)


def _module_name(rel: str) -> str:
    name = rel.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


# --- files


def _jsonl(docs: Iterable[Document]) -> bytes:
    return b"".join(doc.json_line() for doc in docs)


def _split_jsonl(docs: Iterable[Document], file_bytes: int) -> list[bytes]:
    """Documents as jsonl files of about ``file_bytes`` each (a file ends after a document)."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for doc in docs:
        line = doc.json_line()
        current.append(line)
        size += len(line)
        if size >= file_bytes:
            chunks.append(b"".join(current))
            current, size = [], 0
    if current:
        chunks.append(b"".join(current))
    return chunks


def _safe_name(doc_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", doc_id.removeprefix("topic/"))


__all__ = [
    "LOG_REPEATS",
    "Document",
    "code_documents",
    "describe_builtin_corpora",
    "docstring_documents",
    "logdump_document",
    "note_documents",
    "stdlib_sources",
    "topic_documents",
    "write_builtin_corpora",
]
