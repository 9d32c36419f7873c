"""Write tensors as the releases do: ``model.safetensors``, or N shards with ``model.safetensors.index.json``."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file


def save_tensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """safetensors' ``save_file`` with the mode ``open`` gives (0666 less the umask), as config.json
    gets: ``save_file`` renames a private temporary file into place, so its file is 0600 otherwise."""
    save_file(tensors, str(file))
    umask = os.umask(0)  # read it: there is no getter
    os.umask(umask)
    file.chmod(0o666 & ~umask)


def check_shards(shards: int, tensors: int) -> None:
    """Each of ``shards`` files holds at least one of the ``tensors``."""
    if not 1 <= shards <= tensors:
        raise ValueError(f"--shards must be from 1 to the checkpoint's {tensors} tensors, got {shards}")


def remove_weights(out: Path) -> None:
    """The weights a checkpoint in ``out`` holds: one file, or shards and their index."""
    for stale in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)


@contextlib.contextmanager
def built_beside(out: Path) -> Iterator[Path]:
    """A directory beside ``out`` to build a checkpoint in, moved into ``out`` when the build ends
    without an error (``out`` stays as it was otherwise); removed either way."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        beside = tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.")
    except OSError as exc:  # named by the user's path, not the temporary one
        raise OSError(exc.errno, f"cannot write {out}: {exc.strerror}") from None
    with beside as tmp:
        yield Path(tmp)
        _move_checkpoint(Path(tmp), out)


def _move_checkpoint(built: Path, out: Path) -> None:
    """``built``'s files into ``out`` in place of the checkpoint it held, its old config.json out
    first and the new one in last: a move cut short (Ctrl-C) leaves a directory without a config,
    which no command takes for a checkpoint."""
    out.mkdir(exist_ok=True)
    (out / "config.json").unlink(missing_ok=True)
    remove_weights(out)
    for file in sorted((f for f in built.rglob("*") if f.is_file()), key=lambda f: f == built / "config.json"):
        target = out / file.relative_to(built)
        target.parent.mkdir(parents=True, exist_ok=True)
        file.replace(target)


def write_shards(tensors: dict[str, torch.Tensor], out: Path, shards: int = 1) -> list[Path]:
    """Tensors split into ``shards`` files (none empty) of about equal bytes, in name order (an expert's weight
    and scales may land in different shards, as in the releases); the index maps each name to its file.
    Weights a checkpoint held in ``out`` before (one file, or shards and their index) are removed."""
    check_shards(shards, len(tensors))
    remove_weights(out)
    if shards == 1:
        save_tensors(tensors, out / "model.safetensors")
        return [out / "model.safetensors"]
    names = sorted(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups: list[list[str]] = [[] for _ in range(shards)]
    seen, group = 0, -1
    for i, name in enumerate(names):  # the file its bytes so far point to, but no file skipped or left empty
        group = max(min(seen * shards // max(total, 1), group + 1), shards - (len(names) - i))
        groups[group].append(name)
        seen += tensors[name].numel() * tensors[name].element_size()
    weight_map, files = {}, []
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_tensors({n: tensors[n] for n in group}, out / file)
        weight_map.update(dict.fromkeys(group, file))
        files.append(out / file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return files
