"""Hostile checkpoints and overflowing shapes from Python: each ends in a KilnError naming the
problem, within 2 s, in a child interpreter (so a crash or a hang fails the test instead of ending
the run). Also: dtypes kiln has no tensor type for, names that are not Unicode, checksums."""
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile

import pytest

import kiln


def run_child(body, tmp_path, timeout=20):
    """Runs `body` (Python source; `path` is bound) in a fresh interpreter; it must raise KilnError
    within 2 s of its start. Returns the error text."""
    code = textwrap.dedent("""
        import sys, time, kiln
        path = sys.argv[1]
        t0 = time.perf_counter()
        try:
        {body}
        except kiln.KilnError as e:
            print("KILN_ERROR", time.perf_counter() - t0, str(e).replace("\\n", " "))
            sys.exit(0)
        print("NO_ERROR")
        sys.exit(1)
    """).format(body=textwrap.indent(textwrap.dedent(body), "    "))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, f"exit {r.returncode} (negative: a signal)\n{r.stdout}\n{r.stderr}"
    _, seconds, message = r.stdout.strip().splitlines()[-1].split(" ", 2)
    assert float(seconds) < 2.0, f"took {seconds} s: {message}"
    return message


# ---- hostile files, built here (the C++ tests' generators, tests/io/hostile_files.h, in Python) ----

def torch_zip(path, pickle, record=b"\x3f" * 4):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", record)
        z.writestr("archive/version", "3\n")


def global_(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def string(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def integer(v):
    return b"\x8a\x08" + struct.pack("<q", v)


def int_tuple(vals):
    return b"(" + b"".join(integer(v) for v in vals) + b"t"


def rebuild_args(numel, size, stride):
    return (b"((" + string("storage") + global_("torch", "FloatStorage") + string("0") + string("cpu") + integer(numel)
            + b"tQ" + integer(0) + int_tuple(size) + int_tuple(stride) + b"\x89"
            + global_("collections", "OrderedDict") + b")Rt")


def view_file(path, numel, size, stride):
    pk = b"\x80\x02}" + string("w") + global_("torch._utils", "_rebuild_tensor_v2") + rebuild_args(numel, size, stride)
    torch_zip(path, pk + b"Rs.")


def nested_rebuild_file(path, depth):
    pk = b"\x80\x02}" + string("w") + global_("torch._tensor", "_rebuild_from_type_v2") + b"q\x00"
    pk += global_("torch", "Tensor") + b"q\x010"
    for k in range(depth):
        pk += b"(" + (b"h\x00" if k + 1 < depth else global_("torch._utils", "_rebuild_tensor_v2")) + b"h\x01"
    pk += rebuild_args(1, [1], [1]) + b"}t" * depth + b"Rs."
    torch_zip(path, pk)


def memo_dag_file(path, levels):
    pk = b"\x80\x02}" + string("x") + b"]" + integer(1) + b"aq\x000"
    for k in range(1, levels + 1):
        pk += b"(h" + bytes([k - 1]) + b"h" + bytes([k - 1]) + b"lq" + bytes([k]) + b"0"
    torch_zip(path, pk + b"h" + bytes([levels]) + b"s.")


def safetensors_file(path, header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def test_deep_rebuild_nesting(tmp_path):
    nested_rebuild_file(tmp_path / "f.pt", 20000)
    assert os.path.getsize(tmp_path / "f.pt") < 200 * 1024
    msg = run_child("kiln.load(path + '/f.pt')", tmp_path)
    assert "_rebuild_from_type_v2 nests more than 8 levels" in msg


def test_memo_dag(tmp_path):
    memo_dag_file(tmp_path / "f.pt", 40)
    assert os.path.getsize(tmp_path / "f.pt") < 2048
    msg = run_child("kiln.load(path + '/f.pt')", tmp_path)
    assert "containers are shared through the memo" in msg


def test_zero_stride_view_overflowing_bytes(tmp_path):
    view_file(tmp_path / "f.pt", 1, [2**31, 2**31], [0, 0])
    assert "overflows the 2^63 - 1 bytes" in run_child("kiln.load(path + '/f.pt')", tmp_path)


@pytest.mark.parametrize("expr", ["kiln.zeros(2**31, 2**31)", "kiln.ones(1).expand(2**31, 2**31).contiguous()",
                                  "kiln.zeros(2**62, 4)", "kiln.empty(2**40, 2**40)"])
def test_overflowing_factories(tmp_path, expr):
    assert "overflows" in run_child(expr, tmp_path)


def test_four_gigabyte_view_loads_as_a_view(tmp_path):
    view_file(tmp_path / "f.pt", 1, [2**30], [0])
    assert os.path.getsize(tmp_path / "f.pt") < 1024
    code = textwrap.dedent(f"""
        import resource, sys, time, kiln
        t0 = time.perf_counter()
        w = kiln.load(sys.argv[1])["w"]
        assert w.shape == (2**30,) and w.stride() == (0,), (w.shape, w.stride())
        print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f.pt")], capture_output=True, text=True,
                       timeout=20, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    seconds, rss_kb = r.stdout.split()
    assert float(seconds) < 2.0 and int(rss_kb) < 512 * 1024


def test_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "f.pt")
    assert "it is a FIFO" in run_child("kiln.load(path + '/f.pt')", tmp_path)
    assert "it is a FIFO" in run_child("kiln.load(path + '/f.pt', mmap=True)", tmp_path)


def test_storage_of_2_to_the_62_elements(tmp_path):
    view_file(tmp_path / "f.pt", 2**62, [1], [1])
    msg = run_child("kiln.load(path + '/f.pt')", tmp_path)
    assert "18446744073709551616 bytes: overflows" in msg and "= 0" not in msg


# ---- dtypes kiln has no tensor type for ----

@pytest.mark.parametrize("dtype,fmt", [("I16", "<h"), ("U64", "<Q")])
def test_integer_dtypes_raise_or_round_trip_raw(tmp_path, dtype, fmt):
    values = {"I16": [-3, 2, 30000], "U64": [1, 2**63, 3]}[dtype]
    data = b"".join(struct.pack(fmt, v) for v in values)
    src = tmp_path / "in.safetensors"
    safetensors_file(src, {"x": {"dtype": dtype, "shape": [3], "data_offsets": [0, len(data)]}}, data)
    with pytest.raises(kiln.KilnError, match=rf"tensor 'x' has dtype {dtype} \(shape \[3\]\), which kiln has no"):
        kiln.load(src)
    loaded = kiln.load(src, raw=True)
    x = loaded["x"]
    assert isinstance(x, kiln.RawTensor) and x.dtype == dtype and x.shape == (3,)
    assert bytes(x.data.tolist()) == data
    out = tmp_path / "out.safetensors"
    kiln.save(loaded, out)
    n = struct.unpack("<Q", open(out, "rb").read(8))[0]
    header = json.loads(open(out, "rb").read()[8:8 + n])
    assert header["x"]["dtype"] == dtype and header["x"]["shape"] == [3]
    assert kiln.load(out, raw=True)["x"] == x
    # The torch format carries them too.
    kiln.save(loaded, tmp_path / "out.pt")
    assert kiln.load(tmp_path / "out.pt", raw=True)["x"] == x


def test_names_that_are_not_unicode_are_refused_by_name(tmp_path):
    t = kiln.ones(2)
    with pytest.raises(kiln.KilnError, match="tensor name 'w\\\\udcff' is not valid Unicode text"):
        kiln.save({"w\udcff": t}, tmp_path / "f.safetensors")
    with pytest.raises(kiln.KilnError, match="not valid Unicode text"):
        kiln.save({"w": t}, tmp_path / "f.safetensors", metadata={"k": "v\udcff"})
    with pytest.raises(kiln.KilnError, match="not valid Unicode text"):
        kiln._C._save({"w\udcff": t}, str(tmp_path / "f.safetensors"), "safetensors", {}, False)


def test_checksums_catch_a_changed_weight(tmp_path):
    path = tmp_path / "f.safetensors"
    kiln.save({"w": kiln.randn(4, 8)}, path, metadata={"step": "1"}, checksums=True)
    tensors, meta, _ = kiln.load(path, return_metadata=True)
    assert meta == {"step": "1"}
    raw = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]
    raw[8 + n + 12:8 + n + 16] = struct.pack("<f", 1e30)
    open(path, "wb").write(raw)
    with pytest.raises(kiln.KilnError, match="tensor 'w' fails its checksum"):
        kiln.load(path)
