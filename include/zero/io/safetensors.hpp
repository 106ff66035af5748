#pragma once
/// \file
/// The safetensors file format (https://github.com/huggingface/safetensors): an 8-byte little-endian
/// header length N, N bytes of UTF-8 JSON naming each tensor's dtype, shape and byte range, padded
/// with spaces so the data section starts 8-byte aligned, then the data section with the tensors
/// back to back in offset order. `writer` streams a file in any chunking and publishes it only when
/// every byte is there; `reader` validates the whole header of a possibly hostile file up front and
/// then reads byte ranges with `pread`, so one reader serves many threads.
///
/// Supported dtypes: F32, F16, BF16, F64, I32, I64 and U8 (zero's `dtype`s); other safetensors
/// dtypes (BOOL, I8, I16, U16, U32, U64, F8_*) are refused by name.
///
/// The pieces: zero/io/safetensors_format.hpp (tensors, limits, dtype names), safetensors_writer.hpp
/// and safetensors_reader.hpp; this header includes them all.

#include "zero/io/safetensors_format.hpp"
#include "zero/io/safetensors_reader.hpp"
#include "zero/io/safetensors_writer.hpp"
