"""A minimal reader of the safetensors format (8-byte header size, JSON header, raw data)."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsError(ValueError):
    """The file is not a well-formed safetensors file."""


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the file, copied out of a read-only memory map."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        if len(mapped) < 8:
            raise SafetensorsError(f"{path}: too short to be safetensors")
        (header_len,) = struct.unpack("<Q", mapped[:8])
        if 8 + header_len > len(mapped):
            raise SafetensorsError(f"{path}: header length {header_len} exceeds the file")
        header = json.loads(mapped[8 : 8 + header_len])
        header.pop("__metadata__", None)
        data_start = 8 + header_len
        tensors = {}
        for name, info in header.items():
            dtype = _DTYPES.get(info["dtype"])
            if dtype is None:
                raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
            begin, end = info["data_offsets"]
            raw = bytearray(mapped[data_start + begin : data_start + end])
            tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(info["shape"]) if raw else torch.empty(info["shape"], dtype=dtype)
        return tensors


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (contiguous, CPU) as a safetensors file; used for test fixtures."""
    names = {dtype: name for name, dtype in _DTYPES.items()}
    header: dict[str, object] = {}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        blob = tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        for blob in blobs:
            file.write(blob)
