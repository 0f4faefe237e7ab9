#!/usr/bin/env python3
"""Writes the broken safetensors files in this directory and README.md.

Each case is (file name, header text or raw bytes, data buffer, the error the
reader must report). Run from anywhere: python3 make_corpus.py. Stdlib only,
and deliberately independent of nibble's writer. The expected substrings are
repeated in tests/unit/test_safetensors.cpp (kBadCorpus); keep them in step.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def st(header: str, data: bytes = b"", length=None) -> bytes:
    """8-byte little-endian header length, the header, the data buffer."""
    h = header.encode("utf-8")
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def entry(dtype="F32", shape="[2]", offsets="[0, 8]") -> str:
    return f'{{"dtype": "{dtype}", "shape": {shape}, "data_offsets": {offsets}}}'


D8 = bytes(range(8))
D12 = bytes(range(12))

# (file, bytes, expected substring, what is wrong)
CASES = [
    ("empty.safetensors", b"",
     "truncated: the file is 0 bytes", "zero-length file"),
    ("short.safetensors", b"\x02\x00\x00",
     "truncated: the file is 3 bytes, expected at least 8", "shorter than the 8-byte header length"),
    ("header_len_past_eof.safetensors", st('{"a": ' + entry() + "}", D8, length=4096),
     "header length 4096 runs past the end of the file", "N larger than the rest of the file"),
    ("header_len_absurd.safetensors", struct.pack("<Q", 1 << 40) + b"{}",
     "header length 1099511627776 is absurd", "N above the 100 MB limit"),
    ("header_empty.safetensors", st(""),
     "header is empty", "N = 0"),
    ("header_not_object.safetensors", st("[1, 2, 3]"),
     "header is not a JSON object: expected it to begin with '{', found '['", "header is a JSON array"),
    ("header_leading_space.safetensors", st(' {"a": ' + entry() + "}", D8),
     "expected it to begin with '{', found ' '", "the format requires the first header byte to be '{'"),
    ("json_truncated.safetensors", st('{"a": {"dtype": "F32", "shape": [2], '),
     "header JSON is malformed: it ends too early (37 bytes)", "header JSON ends mid-object"),
    ("json_trailing_garbage.safetensors", st('{"a": ' + entry() + "} x", D8),
     "header JSON is malformed at byte", "something other than spaces after the object"),
    ("json_bad_utf8.safetensors", struct.pack("<Q", 7) + b'{"\xff":1}',
     "header JSON is malformed at byte 3 of 7: parse error at line 1, column 3", "a key that is not UTF-8"),
    ("entry_not_object.safetensors", st('{"a": [1, 2]}'),
     "tensor 'a': expected an object with dtype, shape and data_offsets, found an array",
     "tensor entry is an array"),
    ("missing_dtype.safetensors", st('{"a": {"shape": [2], "data_offsets": [0, 8]}}', D8),
     "tensor 'a': missing \"dtype\"", "no dtype"),
    ("missing_shape.safetensors", st('{"a": {"dtype": "F32", "data_offsets": [0, 8]}}', D8),
     "tensor 'a': missing \"shape\"", "no shape"),
    ("missing_offsets.safetensors", st('{"a": {"dtype": "F32", "shape": [2]}}', D8),
     "tensor 'a': missing \"data_offsets\"", "no data_offsets"),
    ("dtype_not_string.safetensors", st('{"a": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]}}', D8),
     "tensor 'a': \"dtype\" must be a string, found 7", "dtype is a number"),
    ("unknown_dtype.safetensors", st('{"a": ' + entry(dtype="F4") + "}", D8),
     "tensor 'a': unknown dtype 'F4'; expected one of F64, F32, F16, BF16", "dtype not in the format"),
    ("shape_not_array.safetensors", st('{"a": ' + entry(shape='"2"') + "}", D8),
     "tensor 'a': \"shape\" must be an array of non-negative integers, found '2'", "shape is a string"),
    ("shape_negative.safetensors", st('{"a": ' + entry(shape="[-2]") + "}", D8),
     "tensor 'a': shape[0] must be a non-negative integer, found -2", "negative dimension"),
    ("shape_fraction.safetensors", st('{"a": ' + entry(shape="[1, 2.5]") + "}", D8),
     "tensor 'a': shape[1] must be a non-negative integer, found 2.5", "fractional dimension"),
    ("shape_overflow.safetensors", st('{"a": ' + entry(shape="[4294967296, 4294967296]") + "}", D8),
     "tensor 'a': shape overflow", "numel x dtype size does not fit in 64 bits"),
    ("shape_dim_overflow.safetensors", st('{"a": ' + entry(shape="[0, 18446744073709551615]", offsets="[0, 0]") + "}"),
     "tensor 'a': shape overflow: shape[1] is 18446744073709551615", "a dimension above 2^63-1"),
    ("offsets_not_pair.safetensors", st('{"a": ' + entry(offsets="[0, 4, 8]") + "}", D8),
     "tensor 'a': \"data_offsets\" must be [begin, end], found an array of 3 elements", "three offsets"),
    ("offsets_not_integers.safetensors", st('{"a": ' + entry(offsets='["0", 8]') + "}", D8),
     "tensor 'a': \"data_offsets\" must be two non-negative integers, found ['0', 8]", "offset is a string"),
    ("offsets_negative.safetensors", st('{"a": ' + entry(offsets="[-8, 0]") + "}", D8),
     "tensor 'a': \"data_offsets\" must be two non-negative integers, found [-8, 0]", "negative offset"),
    ("offsets_reversed.safetensors", st('{"a": ' + entry(offsets="[8, 0]") + "}", D8),
     "tensor 'a': data_offsets [8, 0]: expected begin <= end", "begin > end"),
    ("offsets_past_buffer.safetensors", st('{"a": ' + entry(shape="[4]", offsets="[0, 16]") + "}", D8),
     "tensor 'a': data_offsets [0, 16] run beyond the data buffer: expected end <= 8, found 16",
     "tensor extends past the end of the file"),
    ("byte_length_mismatch.safetensors", st('{"a": ' + entry(shape="[3]", offsets="[0, 8]") + "}", D8),
     "tensor 'a': data_offsets [0, 8] span 8 bytes, expected 12", "3 x F32 in 8 bytes"),
    ("overlap.safetensors",
     st('{"a": ' + entry(offsets="[0, 8]") + ', "b": ' + entry(offsets="[4, 12]") + "}", D12),
     "tensors 'a' [0, 8) and 'b' [4, 12) overlap", "two tensors share bytes 4..8"),
    ("empty_inside_other.safetensors",
     st('{"a": ' + entry(offsets="[0, 8]") + ', "e": ' + entry(shape="[0]", offsets="[4, 4]") + "}", D8),
     "tensors 'a' [0, 8) and 'e' [4, 4) overlap", "an empty tensor placed inside another"),
    ("hole_between.safetensors",
     st('{"a": ' + entry(shape="[1]", offsets="[0, 4]") + ', "b": ' + entry(shape="[1]", offsets="[8, 12]") + "}", D12),
     "hole in the data buffer: bytes [4, 8) between tensors 'a' and 'b'", "gap between two tensors"),
    ("hole_start.safetensors", st('{"a": ' + entry(shape="[1]", offsets="[4, 8]") + "}", D8),
     "hole in the data buffer: bytes [0, 4) before tensor 'a'", "first tensor not at offset 0"),
    ("hole_end.safetensors", st('{"a": ' + entry(shape="[1]", offsets="[0, 4]") + "}", D8),
     "hole in the data buffer: it has 8 bytes but the tensors cover only 4", "bytes after the last tensor"),
    ("metadata_not_object.safetensors", st('{"__metadata__": ["x"]}'),
     "__metadata__ must be an object of string to string, found an array", "metadata is an array"),
    ("metadata_not_string.safetensors", st('{"__metadata__": {"format": "pt", "step": 3}}'),
     "__metadata__ must map strings to strings, but key 'step' has 3", "metadata value is a number"),
    ("duplicate_tensor.safetensors",
     st('{"a": ' + entry(offsets="[0, 8]") + ', "a": ' + entry(offsets="[0, 8]") + "}", D8),
     "duplicate tensor name 'a'", "the same tensor name twice"),
    ("duplicate_field.safetensors",
     st('{"a": {"dtype": "F32", "dtype": "F16", "shape": [2], "data_offsets": [0, 8]}}', D8),
     "tensor 'a': duplicate key 'dtype'", "the same field twice in one entry"),
]


def main():
    names = set()
    for name, blob, _, _ in CASES:
        assert name not in names, name
        names.add(name)
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(blob)
    with open(os.path.join(HERE, "README.md"), "w") as f:
        f.write("# Broken safetensors files\n\n"
                "Written by `make_corpus.py` (run it to regenerate). "
                "`tests/unit/test_safetensors.cpp` opens each one and expects a `nibble::Error` whose one-line\n"
                "message names the file and contains the substring below.\n\n"
                "| file | what is wrong | expected message substring |\n|---|---|---|\n")
        for name, _, expect, why in CASES:
            assert "|" not in expect and "`" not in expect, name
            f.write(f"| `{name}` | {why} | `{expect}` |\n")


if __name__ == "__main__":
    main()
