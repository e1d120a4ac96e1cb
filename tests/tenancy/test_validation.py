"""Upload validation: PEFT adapter directories and the archives they arrive in.

Runs against a tiny fake base model (config.json + a small safetensors file) and adapters
written with ``safetensors.torch.save_file``; only the last base model test reads the real
embedded model, and only its headers.
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import stat
import struct
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from app.tenancy import validation
from app.tenancy.adapters import AdapterError, content_sha256
from app.tenancy.archive import extract_archive
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage import LocalAdapterStore
from tests.support.adapter_dirs import (
    BASE_NAME,
    LAYERS,
    MAX_BYTES,
    SHAPES,
    fake_base_model,
    lora_tensors,
    make_adapter,
    validate,
)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> BaseModelInfo:
    return fake_base_model(tmp_path_factory.mktemp("models"))


def rejects(directory: Path, base: BaseModelInfo, match: str, max_bytes: int = MAX_BYTES) -> None:
    with pytest.raises(AdapterError, match=match):
        validate(directory, base, max_bytes)


def test_base_model_info_reads_linear_layers_only(base: BaseModelInfo) -> None:
    assert base.num_layers == LAYERS
    assert dict(base.linear_shapes) == {suffix: shape for suffix, (_, shape) in SHAPES.items()}
    assert "model.layers.1.mlp.down_proj" in base.modules
    assert not any("embed" in path or "norm" in path for path in base.modules)


def test_base_model_info_of_the_embedded_model() -> None:
    info = BaseModelInfo.from_model_dir(Path("models/SmolLM2-135M-Instruct"))
    assert info.num_layers == 30
    assert info.linear_shapes["q_proj"] == (576, 576)
    assert info.linear_shapes["k_proj"] == (192, 576)
    assert info.linear_shapes["gate_proj"] == (1536, 576)
    assert info.linear_shapes["down_proj"] == (576, 1536)
    assert "embed_tokens" not in info.linear_shapes and "lm_head" not in info.linear_shapes


def test_valid_adapter_passes(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path)
    (directory / "README.md").write_text("# adapter\n")
    result = validate(directory, base)
    assert result.rank == 4
    assert result.lora_alpha == 8.0
    assert result.target_modules == ("q_proj", "v_proj")
    assert result.size_bytes == sum(p.stat().st_size for p in directory.iterdir())
    assert result.sha256 == content_sha256(directory)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_pass(tmp_path: Path, base: BaseModelInfo, dtype: Any) -> None:
    assert validate(make_adapter(tmp_path, tensors=lora_tensors(dtype=dtype)), base).rank == 4


def test_regex_target_modules_pass(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path, target_modules=r".*\.self_attn\.(q_proj|v_proj)")
    assert validate(directory, base).target_modules == ("q_proj", "v_proj")


@pytest.mark.parametrize(
    "claimed", [BASE_NAME, f"HF-Org/{BASE_NAME.lower()}", f"/models/{BASE_NAME}/", "", None]
)
def test_base_model_name_matches_loosely(
    tmp_path: Path, base: BaseModelInfo, claimed: str | None
) -> None:
    directory = make_adapter(tmp_path, base_model_name_or_path=claimed)
    assert validate(directory, base).rank == 4


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"peft_type": "PREFIX_TUNING"}, "peft_type is 'PREFIX_TUNING'; only LORA"),
        ({"r": 64}, r"rank \(r\) is 64; it must be between 1 and 16"),
        ({"r": 0}, r"rank \(r\) is 0"),
        ({"r": "8"}, r"rank \(r\) must be an integer"),
        ({"r": None}, r"rank \(r\) is missing"),
        ({"lora_alpha": "big"}, "lora_alpha must be a number"),
        ({"target_modules": ["q_proj", "wrong_proj"]}, "not linear layers.*: wrong_proj"),
        ({"target_modules": ["embed_tokens"]}, "not linear layers.*: embed_tokens"),
        ({"target_modules": []}, "target_modules is missing or empty"),
        ({"target_modules": None}, "target_modules is missing or empty"),
        ({"target_modules": "lm_head"}, "regex 'lm_head' matches no linear layer"),
        (
            {"base_model_name_or_path": "meta-llama/Llama-2-7b-hf"},
            "trained for base model 'meta-llama/Llama-2-7b-hf', but this server serves "
            f"'{BASE_NAME}'",
        ),
        ({"use_dora": True}, "use_dora=True is not supported: DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save=.* is not supported"),
        ({"layers_to_transform": [0]}, "layers_to_transform=.* is not supported"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern=.* is not supported"),
        ({"alpha_pattern": {"q_proj": 8}}, "alpha_pattern=.* is not supported"),
        ({"bias": "all"}, "bias='all' is not supported"),
        ({"layer_replication": [[0, 2]]}, "layer_replication=.* is not supported"),
        ({"alora_invocation_tokens": [1, 2]}, r"activated LoRA \(aLoRA\) is not served"),
    ],
)
def test_bad_config_is_rejected(
    tmp_path: Path, base: BaseModelInfo, config: dict[str, Any], match: str
) -> None:
    rejects(make_adapter(tmp_path, **config), base, match)


def test_unreadable_config_is_rejected(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path)
    (directory / "adapter_config.json").write_text("{not json")
    rejects(directory, base, "adapter_config.json is not valid JSON")
    (directory / "adapter_config.json").write_text("[1, 2]")
    rejects(directory, base, "adapter_config.json must hold a JSON object")
    (directory / "adapter_config.json").unlink()
    rejects(directory, base, "adapter_config.json is missing")


@pytest.mark.parametrize("name", ["adapter_model.bin", "training_args.bin", "ckpt/optimizer.pt"])
def test_pickle_weights_are_rejected(tmp_path: Path, base: BaseModelInfo, name: str) -> None:
    directory = make_adapter(tmp_path)
    (directory / name).parent.mkdir(exist_ok=True)
    (directory / name).write_bytes(b"\x80\x04pickle")
    rejects(
        directory, base, f"pickle-based weights are not accepted; convert to safetensors: {name}"
    )


def test_unexpected_files_are_named(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path)
    (directory / "notes.txt").write_text("hi")
    rejects(directory, base, "unexpected files: notes.txt")


def test_symlink_is_rejected(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path)
    (directory / "README.md").symlink_to("/etc/passwd")
    rejects(directory, base, "symbolic links are not accepted: README.md")


def test_missing_weights_and_oversize_are_rejected(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path)
    rejects(directory, base, r"over the limit of 100 bytes", max_bytes=100)
    (directory / "adapter_model.safetensors").unlink()
    rejects(directory, base, "adapter_model.safetensors is missing")


def rename(tensors: dict[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    return {key.replace(old, new): value for key, value in tensors.items()}


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        (lora_tensors(rank=8), r"has shape \[8, 16\], expected \[4, 16\]"),
        (
            {k: v.T.contiguous() for k, v in lora_tensors().items()},
            r"has shape \[16, 4\], expected \[4, 16\]",
        ),
        (
            {
                k: v
                for k, v in lora_tensors().items()
                if "layers.1.self_attn.v_proj.lora_B" not in k
            },
            "model.layers.1.self_attn.v_proj has no lora_B tensor",
        ),
        (rename(lora_tensors(), "layers.1.", "layers.5."), "layer 5 does not exist"),
        (rename(lora_tensors(), "self_attn.q", "mlp.q"), "mlp.q_proj is not a linear layer"),
        (lora_tensors(("q_proj", "k_proj")), "adapts model.layers.0.self_attn.k_proj, which"),
        (rename(lora_tensors(), "lora_A.weight", "weight"), "unexpected tensor"),
        (lora_tensors(dtype=torch.float64), "has dtype F64; only F16, BF16, F32"),
        ({}, "holds no LoRA tensors"),
    ],
)
def test_bad_tensors_are_rejected(
    tmp_path: Path, base: BaseModelInfo, tensors: dict[str, torch.Tensor], match: str
) -> None:
    rejects(make_adapter(tmp_path, tensors=tensors), base, match)


@pytest.mark.parametrize("corrupt", [b"not safetensors at all", b"\xff" * 8 + b"{}"])
def test_corrupt_safetensors_is_rejected(
    tmp_path: Path, base: BaseModelInfo, corrupt: bytes
) -> None:
    directory = make_adapter(tmp_path)
    (directory / "adapter_model.safetensors").write_bytes(corrupt)
    rejects(directory, base, "adapter_model.safetensors is not a valid safetensors file")


def test_truncated_safetensors_is_rejected(tmp_path: Path, base: BaseModelInfo) -> None:
    directory = make_adapter(tmp_path)
    weights = directory / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    rejects(directory, base, "adapter_model.safetensors is not a valid safetensors file")


# Archives.

Member = tuple[str, bytes]


def adapter_members(base_tmp: Path, prefix: str = "") -> list[Member]:
    source = make_adapter(base_tmp, "source")
    return [(prefix + path.name, path.read_bytes()) for path in sorted(source.iterdir())]


def build_zip(path: Path, members: list[Member], modes: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if modes and name in modes:
                info.external_attr = modes[name] << 16
            archive.writestr(info, data)
    return path


def build_tar(path: Path, members: list[Member], special: tarfile.TarInfo | None = None) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        if special is not None:
            archive.addfile(special)
    return path


def left_nothing(destination: Path) -> bool:
    return not destination.exists() or not any(destination.iterdir())


def rejects_archive(archive: Path, match: str, **limits: int) -> None:
    destination = archive.parent / "unpacked"
    with pytest.raises(AdapterError, match=match):
        extract_archive(archive, archive.name, destination, **{"max_bytes": MAX_BYTES, **limits})
    assert left_nothing(destination)


def test_zip_with_top_folder_unpacks_to_a_valid_adapter(
    tmp_path: Path, base: BaseModelInfo
) -> None:
    archive = build_zip(tmp_path / "a.zip", adapter_members(tmp_path, "legal-v2/"))
    directory = extract_archive(archive, "a.zip", tmp_path / "out", max_bytes=MAX_BYTES)
    assert directory == tmp_path / "out" / "legal-v2"
    assert validate(directory, base).sha256 == content_sha256(tmp_path / "source")


def test_flat_tar_gz_unpacks_into_destination(tmp_path: Path, base: BaseModelInfo) -> None:
    archive = build_tar(tmp_path / "a.tar.gz", adapter_members(tmp_path, "./"))
    directory = extract_archive(archive, "A.TGZ", tmp_path / "out", max_bytes=MAX_BYTES)
    assert directory == tmp_path / "out"
    assert validate(directory, base).sha256 == content_sha256(tmp_path / "source")


def build(kind: str, path: Path, members: list[Member]) -> Path:
    return (build_zip if kind == "zip" else build_tar)(path.with_suffix(f".{kind}"), members)


@pytest.mark.parametrize("kind", ["zip", "tgz"])
@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("../x", r"'../x' points outside the archive"),
        ("a/../../x", "points outside the archive"),
        ("/etc/cron.d/x", "'/etc/cron.d/x' has an absolute path"),
        ("C:/x", "has an absolute path"),
        ("..\\x", "backslashes"),
    ],
)
def test_unsafe_member_names_are_rejected(tmp_path: Path, kind: str, name: str, match: str) -> None:
    rejects_archive(build(kind, tmp_path / "a", [*adapter_members(tmp_path), (name, b"x")]), match)


@pytest.mark.parametrize(
    ("kind", "link", "match"),
    [
        (tarfile.SYMTYPE, "/etc/passwd", "is a symbolic link"),
        (tarfile.LNKTYPE, "adapter_config.json", "is a hard link"),
        (tarfile.FIFOTYPE, "", "is a FIFO"),
        (tarfile.CHRTYPE, "", "is a character device"),
    ],
)
def test_tar_links_and_devices_are_rejected(
    tmp_path: Path, kind: bytes, link: str, match: str
) -> None:
    special = tarfile.TarInfo("README.md")
    special.type, special.linkname = kind, link
    members = adapter_members(tmp_path)
    rejects_archive(build_tar(tmp_path / "a.tar.gz", members, special), match)


def test_zip_symlink_is_rejected(tmp_path: Path) -> None:
    members = [*adapter_members(tmp_path), ("README.md", b"/etc/passwd")]
    archive = build_zip(tmp_path / "a.zip", members, {"README.md": stat.S_IFLNK | 0o777})
    rejects_archive(archive, "'README.md' is a symbolic link")


def test_duplicate_names_are_rejected(tmp_path: Path) -> None:
    members = adapter_members(tmp_path)
    with pytest.warns(UserWarning, match="Duplicate name"):
        archive = build_zip(tmp_path / "a.zip", [*members, members[0]])
    rejects_archive(archive, "appears more than once")


def test_too_many_members_are_rejected(tmp_path: Path) -> None:
    members = [*adapter_members(tmp_path), *((f"f{i}.txt", b"") for i in range(5))]
    rejects_archive(build_zip(tmp_path / "a.zip", members), "more than 3 members", max_files=3)


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_bomb_is_rejected_by_declared_size(tmp_path: Path, kind: str) -> None:
    members = [*adapter_members(tmp_path), ("bomb.bin", bytes(10 << 20))]
    rejects_archive(build(kind, tmp_path / "a", members), f"unpacks to more than {MAX_BYTES}")


def lie_about_sizes(path: Path, name: bytes, size: int) -> None:
    """Rewrite ``name``'s uncompressed size in its local and central directory headers."""
    data = bytearray(path.read_bytes())
    for signature, offset, name_at in ((b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)):
        start = data.find(signature)
        while data[start + name_at : start + name_at + len(name)] != name:
            start = data.find(signature, start + 1)
        data[start + offset : start + offset + 4] = struct.pack("<I", size)
    path.write_bytes(bytes(data))


def test_zip_bomb_with_lying_sizes_is_rejected(tmp_path: Path) -> None:
    archive = build_zip(tmp_path / "a.zip", [*adapter_members(tmp_path), ("z", bytes(10 << 20))])
    lie_about_sizes(archive, b"z", 1000)
    with zipfile.ZipFile(archive) as check:
        assert check.getinfo("z").file_size == 1000
    # The decompressor stops at the declared size, so the bomb shows up as a bad checksum.
    rejects_archive(archive, "could not be unpacked: Bad CRC-32")


def test_tar_stream_is_capped_beyond_member_sizes(tmp_path: Path) -> None:
    huge_header = tarfile.TarInfo("README.md")
    huge_header.pax_headers = {"comment": "x" * (2 * MAX_BYTES)}
    archive = build_tar(tmp_path / "a.tar.gz", adapter_members(tmp_path), huge_header)
    rejects_archive(archive, f"unpacks to more than {MAX_BYTES} bytes")


@pytest.mark.parametrize(
    ("filename", "write", "match"),
    [
        ("a.rar", lambda p: p.write_bytes(b"Rar!\x1a\x07"), "is not a .zip, .tar.gz or .tgz"),
        ("a.zip", lambda p: build_tar(p, []), "'a.zip' is not a zip archive"),
        ("a.tar.gz", lambda p: build_zip(p, [("x", b"")]), "not a gzip-compressed tar archive"),
        ("a.zip", lambda p: p.write_bytes(b"PK\x03\x04" + b"\0" * 60), "could not be unpacked"),
        ("a.tgz", lambda p: p.write_bytes(b"\x1f\x8b" + b"\0" * 60), "could not be unpacked"),
    ],
)
def test_unknown_mismatched_and_corrupt_archives_are_rejected(
    tmp_path: Path, filename: str, write: Callable[[Path], object], match: str
) -> None:
    archive = tmp_path / "upload"
    write(archive)
    destination = tmp_path / "unpacked"
    with pytest.raises(AdapterError, match=match):
        extract_archive(archive, filename, destination, max_bytes=MAX_BYTES)
    assert left_nothing(destination)


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_truncated_archive_is_rejected(tmp_path: Path, kind: str) -> None:
    archive = build(kind, tmp_path / "a", adapter_members(tmp_path))
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    rejects_archive(archive, "could not be unpacked")


def test_existing_destination_is_emptied_not_removed(tmp_path: Path) -> None:
    archive = build_zip(tmp_path / "a.zip", [*adapter_members(tmp_path), ("../x", b"x")])
    destination = tmp_path / "unpacked"
    destination.mkdir()
    with pytest.raises(AdapterError):
        extract_archive(archive, "a.zip", destination, max_bytes=MAX_BYTES)
    assert destination.is_dir() and not any(destination.iterdir())
    assert not (tmp_path / "x").exists()


def test_non_empty_destination_is_refused_and_kept(tmp_path: Path) -> None:
    archive = build_zip(tmp_path / "a.zip", adapter_members(tmp_path))
    (tmp_path / "unpacked").mkdir()
    (tmp_path / "unpacked" / "keep").write_text("mine")
    with pytest.raises(AdapterError, match="destination is not empty"):
        extract_archive(archive, "a.zip", tmp_path / "unpacked", max_bytes=MAX_BYTES)
    assert (tmp_path / "unpacked" / "keep").read_text() == "mine"
    assert os.listdir(tmp_path / "unpacked") == ["keep"]


# Hostile input: every refusal is an AdapterError that shows no server path, in bounded time.

EVIL_PATTERN = "(?:[\\w.]+)+!"  # catastrophic backtracking for Python's re on every name


@pytest.mark.timeout(20)
def test_backtracking_target_pattern_is_evaluated_in_bounded_time(
    tmp_path: Path, base: BaseModelInfo
) -> None:
    adapter = make_adapter(tmp_path, target_modules=EVIL_PATTERN)
    # The matching's own time: this thread's CPU, which a busy machine does not inflate (the
    # matcher's budget is wall-clock, never less).
    started = time.thread_time()
    rejects(adapter, base, "matches no linear layer")
    assert time.thread_time() - started < 2 * validation.TARGET_PATTERN_BUDGET_S + 1


def test_target_pattern_over_its_time_budget_is_refused(
    tmp_path: Path, base: BaseModelInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(validation, "TARGET_PATTERN_BUDGET_S", 0.0)
    directory = make_adapter(tmp_path, target_modules=r".*\.self_attn\.(q_proj|v_proj)")
    rejects(directory, base, "target_modules regex .* takes too long.*list the module names")


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        ("q_proj|" * 200, "target_modules regex is over 1000 characters"),
        ("(unclosed", "target_modules '\\(unclosed' is not a valid regex"),
        ([1, 2], "target_modules must be a list of module names"),
        ({"q_proj": True}, "target_modules is missing or empty"),
    ],
)
def test_bad_target_modules_are_refused(
    tmp_path: Path, base: BaseModelInfo, targets: object, match: str
) -> None:
    rejects(make_adapter(tmp_path, target_modules=targets), base, match)


def refusal_message(archive: Path, destination: Path, **limits: int) -> str:
    with pytest.raises(AdapterError) as caught:
        extract_archive(archive, archive.name, destination, **{"max_bytes": MAX_BYTES, **limits})
    assert left_nothing(destination)
    return str(caught.value)


@pytest.mark.parametrize("kind", ["zip", "tgz"])
@pytest.mark.parametrize(
    ("names", "match"),
    [
        (["a", "a/b"], "'a/b' is inside 'a', which is a file"),
        (["a/b", "a"], "'a' is both a file and a directory"),
        (["x/a", "x/a/b/c"], "inside 'x/a', which is a file"),
    ],
)
def test_a_name_that_is_a_file_and_a_directory_is_refused_without_server_paths(
    tmp_path: Path, kind: str, names: list[str], match: str
) -> None:
    archive = build(kind, tmp_path / "a", [(name, b"x") for name in names])
    message = refusal_message(archive, tmp_path / "unpacked")
    assert re.search(match, message) and str(tmp_path) not in message


def set_zip_utf8_name(path: Path, old: bytes, new: bytes) -> None:
    """Rename a member to raw bytes ``new`` and flag its name as UTF-8 (bit 11)."""
    data = bytearray(path.read_bytes().replace(old, new))
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = data.find(signature)
        while start >= 0:
            flags = struct.unpack_from("<H", data, start + flags_at)[0]
            struct.pack_into("<H", data, start + flags_at, flags | 0x800)
            start = data.find(signature, start + 1)
    path.write_bytes(bytes(data))


def hostile_archives(tmp_path: Path) -> dict[str, tuple[Path, dict[str, int]]]:
    """Archives an attacker might upload, each refused for its own reason."""
    members = adapter_members(tmp_path)
    archives: dict[str, tuple[Path, dict[str, int]]] = {}

    def add(label: str, path: Path, **limits: int) -> None:
        archives[label] = (path, limits)

    for kind in ("zip", "tgz"):
        for label, name in [
            ("absolute", "/etc/cron.d/x"),
            ("dotdot", "../../x"),
            ("drive", "C:/x"),
            ("backslash", "..\\x"),
            ("control characters", "README\x1b[2J.md"),
            ("long name", "n" * 300),
        ]:
            add(
                f"{kind}: {label}",
                build(kind, tmp_path / f"{kind}-{label}", [*members, (name, b"x")]),
            )
        add(
            f"{kind}: file and directory",
            build(kind, tmp_path / f"{kind}-fd", [("a", b""), ("a/b", b"")]),
        )
        bomb = [*members, ("bomb.bin", bytes(4 * MAX_BYTES))]
        add(f"{kind}: bomb by size", build(kind, tmp_path / f"{kind}-bomb", bomb))
        many = [*members, *((f"f{i}", b"") for i in range(70))]
        add(f"{kind}: too many files", build(kind, tmp_path / f"{kind}-many", many))
        truncated = build(kind, tmp_path / f"{kind}-cut", members)
        truncated.write_bytes(truncated.read_bytes()[:-100])
        add(f"{kind}: truncated", truncated)
    for tar_kind, link in [
        (tarfile.SYMTYPE, "/etc/passwd"),
        (tarfile.LNKTYPE, "/etc/passwd"),
        (tarfile.CHRTYPE, ""),
        (tarfile.BLKTYPE, ""),
        (tarfile.FIFOTYPE, ""),
    ]:
        special = tarfile.TarInfo("README.md")
        special.type, special.linkname = tar_kind, link
        add(f"tgz: {special.type!r}", build_tar(tmp_path / f"t{tar_kind!r}.tgz", members, special))
    non_utf8 = tarfile.TarInfo("READ\udcffME.md")
    add("tgz: non-UTF-8 name", build_tar(tmp_path / "nonutf8.tgz", members, non_utf8))
    utf8_flagged = build_zip(tmp_path / "nonutf8.zip", [*members, ("READXME.md", b"x")])
    set_zip_utf8_name(utf8_flagged, b"READXME.md", b"READ\xffME.md")
    add("zip: non-UTF-8 name", utf8_flagged)
    symlink = build_zip(
        tmp_path / "link.zip",
        [*members, ("README.md", b"/etc/passwd")],
        {"README.md": stat.S_IFLNK | 0o777},
    )
    add("zip: symlink", symlink)
    device = build_zip(
        tmp_path / "dev.zip", [*members, ("README.md", b"")], {"README.md": stat.S_IFCHR | 0o666}
    )
    add("zip: device", device)
    with pytest.warns(UserWarning, match="Duplicate name"):
        add("zip: duplicate", build_zip(tmp_path / "dup.zip", [*members, members[0]]))
    lying = build_zip(tmp_path / "lying.zip", [*members, ("z", bytes(10 << 20))])
    lie_about_sizes(lying, b"z", 1000)
    add("zip: bomb with lying sizes", lying)
    nested = build_zip(tmp_path / "inner.zip", members)
    add(
        "zip: nested archive",
        build_zip(tmp_path / "nested.zip", [("inner.zip", nested.read_bytes())]),
    )
    encrypted = build_zip(tmp_path / "enc.zip", members)
    data = bytearray(encrypted.read_bytes())
    central = data.find(b"PK\x01\x02")
    data[central + 8] |= 1
    encrypted.write_bytes(bytes(data))
    add("zip: encrypted", encrypted)
    add("zip: compression method 99", zip_with_method(tmp_path / "m99.zip", 99))
    add("zip: lzma garbage", zip_with_method(tmp_path / "lzma.zip", zipfile.ZIP_LZMA))
    return archives


def zip_with_method(path: Path, method: int) -> Path:
    """A zip whose only member claims ``method`` but holds stored (uncompressed) bytes."""
    build_zip(path, [("README.md", b"hello" * 100)])
    data = bytearray(path.read_bytes())
    for signature, method_at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        start = data.find(signature)
        struct.pack_into("<H", data, start + method_at, method)
    path.write_bytes(bytes(data))
    return path


def test_hostile_archives_are_refused_without_server_paths(tmp_path: Path) -> None:
    outcomes = {}
    for label, (archive, limits) in hostile_archives(tmp_path).items():
        destination = tmp_path / "unpacked"
        try:
            extract_archive(archive, archive.name, destination, max_bytes=MAX_BYTES, **limits)
        except AdapterError as exc:
            outcomes[label] = str(exc)
        else:  # unpacked: only validation can refuse it
            outcomes[label] = "unpacked"
            shutil.rmtree(destination)
        assert left_nothing(destination) or outcomes[label] == "unpacked"
    leaks = {label: message for label, message in outcomes.items() if str(tmp_path) in message}
    assert not leaks
    assert [label for label, message in outcomes.items() if message == "unpacked"] == [
        "zip: nested archive"  # unpacked as a file; the directory check refuses inner.zip
    ]


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_corrupted_archives_only_ever_raise_adapter_errors(tmp_path: Path, kind: str) -> None:
    """Random byte flips anywhere: refused or unpacked, never another exception or a path."""
    pristine = build(kind, tmp_path / "a", adapter_members(tmp_path)).read_bytes()
    rng = random.Random(14)
    for attempt in range(300):
        data = bytearray(pristine)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        archive = tmp_path / f"fuzz.{kind}"
        archive.write_bytes(bytes(data))
        destination = tmp_path / f"out{attempt}"
        try:
            extract_archive(archive, archive.name, destination, max_bytes=MAX_BYTES)
        except AdapterError as exc:
            assert str(tmp_path) not in str(exc)
            assert left_nothing(destination)


def test_zip_directory_larger_than_the_member_limit_is_refused_before_parsing(
    tmp_path: Path,
) -> None:
    members = [*adapter_members(tmp_path), *((f"file-{i:04d}", b"") for i in range(300))]
    archive = build_zip(tmp_path / "a.zip", members)
    data = bytearray(archive.read_bytes())
    record = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, record + 8, 1, 1)  # claims one entry
    archive.write_bytes(bytes(data))
    parsed = []
    original = zipfile.ZipFile.__init__

    def spy(self: zipfile.ZipFile, *args: Any, **kwargs: Any) -> None:
        parsed.append(args)
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zipfile.ZipFile, "__init__", spy)
        rejects_archive(archive, "more than 3 members", max_files=3)
    assert not parsed


def test_a_registration_path_with_control_characters_is_refused(tmp_path: Path) -> None:
    storage = LocalAdapterStore(
        tmp_path, BaseModelInfo("base", {"q_proj": (8, 8)}, 1), max_rank=16, max_bytes=1 << 20
    )
    for path in ("a\x00b", "a\nb"):
        with pytest.raises(AdapterError, match="control characters"):
            storage.from_path(path)
