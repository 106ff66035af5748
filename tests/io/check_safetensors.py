#!/usr/bin/env python3
"""Checks zero's safetensors files against Python's safetensors package, and writes files for zero.

    check_safetensors.py check FILE   load FILE (written by tests/io/safetensors_interop.cpp) and
                                      check every name, dtype, shape, value and the metadata
    check_safetensors.py write DIR    write DIR/from_python.safetensors with save_file and
                                      DIR/from_python_bf16.safetensors (numpy has no bfloat16)

The expected values match safetensors_interop.cpp. Exits 1 with a message on any difference, and
when numpy or safetensors is not installed (scripts/deps installs both).
"""
import sys

try:
    import numpy as np
    import safetensors
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    sys.exit(
        f"check_safetensors.py: {e}; the safetensors interop test needs numpy and Python's safetensors "
        f"package for {sys.executable} (run scripts/deps, or: {sys.executable} -m pip install numpy safetensors)"
    )


def bf16_bits(values):
    """bfloat16 bit patterns of float32 values that bfloat16 holds exactly."""
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


EXPECTED = {  # name: (safetensors dtype, shape, numpy array of the raw values)
    "w": ("F32", [3, 5], ((np.arange(15, dtype=np.float32) - 7) * np.float32(0.25)).reshape(3, 5)),
    "h": ("F16", [4], np.array([1.0, -2.5, 0.125, 65504.0], dtype=np.float16)),
    "b": ("BF16", [2, 3], bf16_bits(np.arange(6, dtype=np.float32) * np.float32(0.5) - np.float32(1.0)).reshape(2, 3)),
    "steps": ("I64", [2], np.array([7, -3], dtype=np.int64)),
    "mask": ("U8", [5], np.array([0, 1, 2, 254, 255], dtype=np.uint8)),
    "lr": ("F32", [], np.array(0.001, dtype=np.float32)),
    "none": ("F16", [0, 3], np.zeros((0, 3), dtype=np.float16)),
}

errors = []


def expect(ok, what):
    if not ok:
        errors.append(what)


def check(path):
    # The package's own parser gives every tensor's dtype, shape and raw bytes, bf16 included.
    with open(path, "rb") as f:
        parsed = dict(safetensors.deserialize(f.read()))
    expect(sorted(parsed) == sorted(EXPECTED), f"names {sorted(parsed)}, expected {sorted(EXPECTED)}")
    for name, (dtype, shape, values) in EXPECTED.items():
        if name not in parsed:
            continue
        t = parsed[name]
        expect(t["dtype"] == dtype, f"{name}: dtype {t['dtype']}, expected {dtype}")
        expect(list(t["shape"]) == shape, f"{name}: shape {t['shape']}, expected {shape}")
        expect(bytes(t["data"]) == values.astype(values.dtype.newbyteorder("<")).tobytes(), f"{name}: bytes differ")
    # The numpy front end, as a user loads a file: every tensor numpy has a dtype for.
    with safetensors.safe_open(path, framework="numpy") as f:
        expect(f.metadata() == {"producer": "zero", "format": "np"}, f"metadata {f.metadata()}")
        for name, (dtype, shape, values) in EXPECTED.items():
            if dtype == "BF16":
                expect(f.get_slice(name).get_dtype() == "BF16", f"{name}: get_slice dtype")
                continue
            a = f.get_tensor(name)
            expect(a.dtype == values.dtype, f"{name}: numpy dtype {a.dtype}, expected {values.dtype}")
            expect(list(a.shape) == shape, f"{name}: numpy shape {a.shape}, expected {shape}")
            expect(np.array_equal(a, values), f"{name}: values {a}, expected {values}")


def write(directory):
    tensors = {name: values for name, (dtype, _, values) in EXPECTED.items() if dtype != "BF16"}
    save_file(tensors, f"{directory}/from_python.safetensors", metadata={"producer": "python", "format": "np"})
    load_file(f"{directory}/from_python.safetensors")  # the package reads back what it wrote
    bits = np.ascontiguousarray(EXPECTED["b"][2])
    path = f"{directory}/from_python_bf16.safetensors"
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        spec = safetensors.TensorSpec(dtype="bfloat16", shape=[2, 3], data_ptr=bits.ctypes.data, data_len=bits.nbytes)
        safetensors.serialize_file({"b": spec}, path)
    else:
        safetensors.serialize_file({"b": {"dtype": "bfloat16", "shape": [2, 3], "data": bits.tobytes()}}, path)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        sys.exit(__doc__)
    if sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        write(sys.argv[2])
    if errors:
        sys.exit("check_safetensors.py: " + sys.argv[2] + ":\n  " + "\n  ".join(errors))
    print(f"check_safetensors.py {sys.argv[1]} {sys.argv[2]}: ok (safetensors {safetensors.__version__})")


if __name__ == "__main__":
    main()
