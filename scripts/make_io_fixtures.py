#!/usr/bin/env python3
"""Checkpoint I/O fixtures and the PyTorch-side checks of kiln's files.

  python3 scripts/make_io_fixtures.py            # (re)writes tests/io/fixtures/*
  python3 scripts/make_io_fixtures.py --check BUILD_DIR
        # runs BUILD_DIR/tests/test_io's export test, then loads kiln's files with
        # torch.load(weights_only=True) and safetensors, comparing bytes with the fixtures

Needs torch and safetensors (only to regenerate or check; the C++ tests read the committed files).
Each fixture has a sidecar <name>.expect.json: per tensor its file dtype, shape and the hex of
its contiguous bytes, plus groups of names that must share one storage.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "io", "fixtures")

ST_NAMES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.uint16: "U16",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32", torch.uint32: "U32",
    torch.float32: "F32", torch.int64: "I64", torch.uint64: "U64", torch.float64: "F64",
    torch.complex64: "C64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ", torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
    torch.float8_e8m0fnu: "F8_E8M0",
}


def raw_bytes(t):
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def expect(tensors, shares=(), metadata=None):
    out = {"tensors": {}, "shares": [list(s) for s in shares], "metadata": metadata or {}}
    for k, t in tensors.items():
        out["tensors"][k] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "hex": raw_bytes(t).hex()}
    return out


def write_expect(name, data):
    with open(os.path.join(FIX, name + ".expect.json"), "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)


def all_dtype_tensors():
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g)
    ts = {
        "f32": r(3, 4), "f64": r(5).double(), "f16": r(2, 3).half(), "bf16": r(4).bfloat16(),
        "i64": torch.randint(-1000, 1000, (3,), generator=g), "i32": torch.randint(-9, 9, (2, 2), generator=g).int(),
        "i16": torch.randint(-9, 9, (3,), generator=g).short(), "i8": torch.randint(-9, 9, (5,), generator=g).char(),
        "u8": torch.randint(0, 255, (4,), generator=g).byte(), "bool": r(6) > 0,
        "u16": torch.randint(0, 60000, (3,), generator=g).to(torch.int32).to(torch.uint16),
        "u32": torch.randint(0, 2**31 - 1, (2,), generator=g).to(torch.uint32),
        "u64": torch.randint(0, 2**62, (2,), generator=g).to(torch.uint64),
        "c64": torch.complex(r(2), r(2)),
        "f8_e4m3": r(4).to(torch.float8_e4m3fn), "f8_e5m2": r(4).to(torch.float8_e5m2),
        "f8_e4m3fnuz": r(3).to(torch.float8_e4m3fnuz), "f8_e5m2fnuz": r(3).to(torch.float8_e5m2fnuz),
        "f8_e8m0": r(3).abs().to(torch.float8_e8m0fnu),
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3), "empty_i64": torch.zeros(2, 0, dtype=torch.int64),
    }
    return ts


def make_safetensors():
    ts = all_dtype_tensors()
    meta = {"format": "pt", "note": "kiln fixture"}
    path = os.path.join(FIX, "st_all_dtypes.safetensors")
    save_file(ts, path, metadata=meta)
    write_expect("st_all_dtypes.safetensors", expect(ts, metadata=meta))
    # Sub-byte dtypes: torch has no F4/F6 tensors, so this file is written by hand.
    header = {"f4": {"dtype": "F4", "shape": [2, 4], "data_offsets": [0, 4]},
              "f6": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [4, 7]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    data = bytes([0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE])
    with open(os.path.join(FIX, "st_subbyte.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    write_expect("st_subbyte.safetensors", {"tensors": {
        "f4": {"dtype": "F4", "shape": [2, 4], "hex": data[:4].hex()},
        "f6": {"dtype": "F6_E2M3", "shape": [4], "hex": data[4:].hex()}}, "shares": [], "metadata": {}})


def torch_state():
    g = torch.Generator().manual_seed(7)
    base = torch.randn(4, 6, generator=g)
    sd = {
        "w": base, "w_t": base.t(), "w_row": base[1], "w_cols": base[:, 1:4], "w_step": base[::2, ::3],
        "bias": torch.nn.Parameter(torch.randn(6, generator=g)),
        "i64": torch.arange(5), "bf16": torch.randn(3, generator=g).bfloat16(),
        "f16": torch.randn(2, 2, generator=g).half(), "i16": torch.tensor([1, -2, 3], dtype=torch.int16),
        "u16": torch.tensor([1, 2, 65535], dtype=torch.int32).to(torch.uint16),
        "f8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(3.0, dtype=torch.float64),
        "empty": torch.zeros(0, 2),
    }
    return sd, [["w", "w_t", "w_row", "w_cols", "w_step"]]


def make_torch():
    sd, shares = torch_state()
    torch.save(sd, os.path.join(FIX, "pt_state_dict.pt"))
    write_expect("pt_state_dict.pt", expect(sd, shares))
    # Nested checkpoint with non-tensor leaves: names join with '.', primitives become metadata.
    nested = {"model": {"a": torch.ones(2), "b": torch.arange(3, dtype=torch.int32)}, "step": 12, "name": "run1"}
    torch.save(nested, os.path.join(FIX, "pt_nested.pt"))
    write_expect("pt_nested.pt", expect({"model.a": nested["model"]["a"], "model.b": nested["model"]["b"]},
                                        metadata={"step": "12", "name": "run1"}))
    # A module's state_dict (an OrderedDict carrying _metadata, set by BUILD), and protocol 4
    # (FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL).
    torch.manual_seed(3)
    mod = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2), torch.nn.BatchNorm1d(2))
    msd = mod.state_dict()
    torch.save(msd, os.path.join(FIX, "pt_module.pt"))
    write_expect("pt_module.pt", expect(dict(msd)))
    p4 = {"x": torch.arange(4, dtype=torch.int32), "y": torch.ones(2, 2).t()}
    torch.save(p4, os.path.join(FIX, "pt_protocol4.pt"), pickle_protocol=4)
    write_expect("pt_protocol4.pt", expect(p4))
    # Big-endian: the same records byte-swapped, byteorder "big" (as a big-endian machine writes).
    be_sd = {"f32": torch.tensor([1.0, -2.5, 3.25]), "i64": torch.tensor([1, 256, -3]),
             "bf16": torch.tensor([1.5, -2.0]).bfloat16(), "view": None}
    be_sd["view"] = be_sd["f32"][1:]
    src = os.path.join(tempfile.mkdtemp(), "le.pt")
    torch.save(be_sd, src)
    dst = os.path.join(FIX, "pt_big_endian.pt")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in info.filename:
                key = info.filename.rsplit("/", 1)[1]
                es = {"0": 4, "1": 8, "2": 2}.get(key, 1)
                data = b"".join(data[i:i + es][::-1] for i in range(0, len(data), es))
            zout.writestr(info.filename, data)
    write_expect("pt_big_endian.pt", expect(be_sd, [["f32", "view"]]))


def check(build_dir):
    out = tempfile.mkdtemp(prefix="kiln_io_export_")
    exe = os.path.join(build_dir, "tests", "test_io")
    subprocess.run([exe, "--gtest_filter=*ExportForTorch*", out], check=True, stdout=subprocess.DEVNULL)
    ok = True
    ref_sd, _ = torch_state()
    for name, loader in [("kiln_state.pt", lambda p: torch.load(p, weights_only=True)),
                         ("kiln_state.safetensors", load_file)]:
        got = loader(os.path.join(out, name))
        for k, t in ref_sd.items():
            if k not in got or got[k].dtype != t.dtype or list(got[k].shape) != list(t.shape) \
                    or raw_bytes(got[k]) != raw_bytes(t):
                print(f"MISMATCH {name}: {k}")
                ok = False
        print(f"{name}: {len(got)} tensors read by {'torch.load(weights_only=True)' if name.endswith('.pt') else 'safetensors'}")
    got = torch.load(os.path.join(out, "kiln_state.pt"), weights_only=True)
    shared = got["w"].untyped_storage().data_ptr() == got["w_t"].untyped_storage().data_ptr()
    print("views share one storage after torch.load:", shared)
    ok = ok and shared
    print("CHECK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2]))
    os.makedirs(FIX, exist_ok=True)
    make_safetensors()
    make_torch()
    for f in sorted(os.listdir(FIX)):
        print(f, os.path.getsize(os.path.join(FIX, f)))
