"""The catalogue of offline models: which chunk packages hold each GGUF, and their checksums.

`catalogue.toml` (beside this module, or the file $DPHIL_CATALOGUE names) is data: it is
read with tomllib and checked field by field, never executed. The chunk packages are
untrusted data too: their versions are pinned, their part files are found BY PATH in the
installed distribution's file list (`importlib.metadata`), never imported, and every part
(where the catalogue has its sha256) and the whole file are checked before the GGUF
appears in the cache. Gemma 3 270M keeps `weights.py`'s own code and cache paths.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from dphil.io.atomic import discard, publish, temp_beside
from dphil.io.errors import ConfigError, DataError, NoInputError
from dphil.serving import weights

GEMMA = "gemma-3-270m"  # built by weights.py, exactly as before the catalogue
DEFAULT = GEMMA  # what `dphil-weights` with no --model gets
_HEX = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


@dataclass(frozen=True)
class Part:
    dist: str  # the distribution (pip name) that holds the part
    version: str  # pinned: another installed version is refused
    path: str  # the part file's path in the distribution's file list
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    file: str  # the GGUF's name in the cache
    hf_dir: str  # the converted directory's name in the cache
    size: int
    sha256: str
    licence: str
    architecture: str
    chat_template: str  # "gguf" (the file's own) or "dphil" (agents/chat_templates.toml)
    extra: str  # the dphil extra that installs its parts
    server: dict[str, Any]
    parts: tuple[Part, ...]

    @property
    def hint(self) -> str:
        return f"pip install 'dphil[{self.extra}]'"


def catalogue_path() -> Path:
    env = os.environ.get("DPHIL_CATALOGUE")
    return Path(env) if env else Path(str(files("dphil.serving").joinpath("catalogue.toml")))


def _field(where: str, table: dict[str, Any], key: str, kind: type, *, optional: bool = False) -> Any:
    if key not in table:
        if optional:
            return None
        raise ConfigError(f"{where}: missing field {key!r}")
    value = table[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ConfigError(f"{where}: field {key!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


def _sha(where: str, value: str | None) -> str | None:
    if value is not None and not _HEX.fullmatch(value):
        raise ConfigError(f"{where}: sha256 must be 64 lowercase hex digits")
    return value


def _size(where: str, value: int | None) -> int | None:
    if value is not None and value <= 0:
        raise ConfigError(f"{where}: size must be positive")
    return value


def _part(where: str, t: Any) -> Part:
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: a part must be a table")
    unknown = set(t) - {"dist", "version", "path", "size", "sha256"}
    if unknown:
        raise ConfigError(f"{where}: unknown part field {sorted(unknown)[0]!r}")
    path = _field(where, t, "path", str)
    if path.startswith("/") or ".." in Path(path).parts:
        raise ConfigError(f"{where}: part path {path!r} must be relative, inside its distribution")
    return Part(
        dist=_field(where, t, "dist", str),
        version=_field(where, t, "version", str),
        path=path,
        size=_size(where, _field(where, t, "size", int, optional=True)),
        sha256=_sha(where, _field(where, t, "sha256", str, optional=True)),
    )


def _model(where: str, t: Any) -> Model:
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: a model must be a table")
    name = _field(where, t, "name", str)
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: model name {name!r} must be lowercase letters, digits, '.', '_', '-'")
    where = f"{where} ({name})"
    for key in ("file", "hf_dir"):
        value = _field(where, t, key, str)
        if "/" in value or value in ("", ".", ".."):
            raise ConfigError(f"{where}: {key} {value!r} must be a plain file name")
    template = _field(where, t, "chat_template", str)
    if template not in ("gguf", "dphil"):
        raise ConfigError(f"{where}: chat_template must be 'gguf' or 'dphil', not {template!r}")
    server = _field(where, t, "server", dict)
    for key, kind in (("ctx_size", int), ("parallel", int), ("jinja", bool)):
        _field(f"{where} server", server, key, kind)
    parts = _field(where, t, "part", list)
    if not parts:
        raise ConfigError(f"{where}: no parts")
    size = _size(where, _field(where, t, "size", int))
    assert size is not None
    sha = _sha(where, _field(where, t, "sha256", str))
    assert sha is not None
    part_list = tuple(_part(f"{where} part {i + 1}", p) for i, p in enumerate(parts))
    sizes = [p.size for p in part_list]
    if None not in sizes and sum(s or 0 for s in sizes) != size:
        raise ConfigError(f"{where}: the parts' sizes add up to {sum(s or 0 for s in sizes)}, not {size}")
    return Model(
        name=name,
        description=_field(where, t, "description", str),
        file=t["file"],
        hf_dir=t["hf_dir"],
        size=size,
        sha256=sha,
        licence=_field(where, t, "licence", str),
        architecture=_field(where, t, "architecture", str),
        chat_template=template,
        extra=_field(where, t, "extra", str),
        server=dict(server),
        parts=part_list,
    )


def load(path: str | os.PathLike | None = None) -> dict[str, Model]:
    """The catalogue's models by name; ConfigError (78) naming the file for anything malformed."""
    p = Path(path) if path is not None else catalogue_path()
    try:
        data = tomllib.loads(p.read_text("utf-8"))
    except FileNotFoundError:
        raise NoInputError(f"{p}: no such model catalogue") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: not a readable TOML catalogue: {e}") from None
    models: dict[str, Model] = {}
    for i, t in enumerate(_field(str(p), data, "model", list)):
        m = _model(f"{p}: model {i + 1}", t)
        if m.name in models:
            raise ConfigError(f"{p}: model {m.name!r} appears twice")
        models[m.name] = m
    return models


def find(name: str, path: str | os.PathLike | None = None) -> Model:
    models = load(path)
    if name not in models:
        from dphil.io.errors import UsageError

        raise UsageError(f"unknown model {name!r} (known: {', '.join(models)})")
    return models[name]


def part_path(model: Model, part: Part) -> Path:
    """Where `part` lies in its installed distribution; NoInputError (66) naming what is missing."""
    try:
        dist = importlib.metadata.distribution(part.dist)
    except importlib.metadata.PackageNotFoundError:
        raise NoInputError(f"{model.file}: part package {part.dist} is not installed ({model.hint})") from None
    if dist.version != part.version:
        raise NoInputError(
            f"{model.file}: part package {part.dist} is version {dist.version}, the catalogue pins "
            f"{part.version} ({model.hint})"
        )
    for f in dist.files or ():
        if str(f) == part.path:
            path = Path(str(dist.locate_file(f)))
            if not path.is_file():
                raise NoInputError(f"{path}: part of {model.file} is missing (reinstall: {model.hint})")
            return path
    raise NoInputError(f"{part.dist}: has no file {part.path} (part of {model.file}; reinstall: {model.hint})")


def installed(model: Model) -> bool:
    try:
        for part in model.parts:
            part_path(model, part)
    except NoInputError:
        return False
    return True


def verify(model: Model, path: str | os.PathLike) -> Path:
    """Check a GGUF file is the catalogued model: 66 if missing, 65 if truncated or altered."""
    p = Path(path)
    if not p.is_file():
        raise NoInputError(f"{p}: no such GGUF file (dphil-weights --model {model.name} makes it)")
    size = p.stat().st_size
    if size != model.size:
        what = "truncated" if size < model.size else "too long"
        raise DataError(f"{p}: {what}: {size} bytes, expected {model.size}")
    if weights.sha256_of(p) != model.sha256:
        raise DataError(f"{p}: sha256 mismatch (corrupt): expected {model.sha256}")
    return p


def _valid(model: Model, path: Path) -> bool:
    try:
        verify(model, path)
    except (NoInputError, DataError):
        return False
    return True


def assemble(model: Model, dest: str | os.PathLike, *, on_build: Callable[[Path], None] | None = None) -> Path:
    """The verified GGUF at `dest`, concatenated from the installed parts when not already there.

    Every part is checked (size and sha256, where catalogued) as it is copied, and the whole
    file before it is renamed into place; on any mismatch the temporary file is removed.
    """
    target = Path(dest)
    with weights._locked(target):
        if _valid(model, target):
            return target
        sources = [(part, part_path(model, part)) for part in model.parts]  # 66 before "assembling"
        if on_build is not None:
            on_build(target)
        fd, tmp = temp_beside(target)
        digest, size = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out:
                for part, p in sources:
                    part_digest, part_size = hashlib.sha256(), 0
                    with open(p, "rb") as fh:
                        while block := fh.read(1 << 20):
                            digest.update(block)
                            part_digest.update(block)
                            part_size += len(block)
                            out.write(block)
                    if part.size is not None and part_size != part.size:
                        raise DataError(
                            f"{p}: part of {model.file} is {part_size} bytes, expected {part.size} "
                            f"(reinstall: {model.hint})"
                        )
                    if part.sha256 is not None and part_digest.hexdigest() != part.sha256:
                        raise DataError(f"{p}: part of {model.file}: sha256 mismatch (reinstall: {model.hint})")
                    size += part_size
                out.flush()
                os.fsync(out.fileno())
            if size != model.size or digest.hexdigest() != model.sha256:
                what = f"{size} bytes, expected {model.size}" if size != model.size else "sha256 mismatch"
                raise DataError(
                    f"{sources[0][1].parent}: parts of {model.file} are truncated or corrupt "
                    f"({what}; reinstall: {model.hint})"
                )
        except BaseException:
            discard(tmp)
            raise
        publish(tmp, target)
    return target


def converted(model: Model, dest: Path) -> bool:
    try:
        return json.loads((dest / weights.MARKER).read_text("utf-8")).get("gguf_sha256") == model.sha256
    except (OSError, ValueError, AttributeError):
        return False


def convert(model: Model, gguf: Path, dest: Path, *, progress: bool = False) -> Path:
    """A transformers directory made once from the verified GGUF `gguf` (as weights.convert)."""
    import contextlib
    import shutil
    import tempfile

    with weights._locked(dest):
        if converted(model, dest):
            return dest
        if dest.exists() and any(dest.iterdir()):
            raise DataError(f"{dest}: exists but is not a finished conversion of {model.file}; remove it and run again")
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
        try:
            weights.convert_file(
                gguf,
                tmp,
                name=model.file,
                sha256=model.sha256,
                add_template=model.chat_template == "dphil",
                progress=progress,
            )
            tmp.chmod(0o755)
            with contextlib.suppress(FileNotFoundError):
                dest.rmdir()
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest
