"""Builds and runs a C program against an ahead-of-time library (`codegen/cpu/aot.py`).

The program reads every argument from one file of raw bytes, calls `<name>_run` with a
64-byte aligned temp arena, writes every result to another file, and checks the run
function's error codes (a NULL inputs array, a misaligned arena). Shared by the core
test (no TF) and the TF test of this folder.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tfxla_lite.codegen.cpu.aot import RUN_BAD_TEMP, RUN_NULL_ARRAY, AotLibrary, link_flags

_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "{name}.h"

int main(int argc, char** argv) {{
  static const size_t in_bytes[] = {upper}_INPUT_BYTES;
  static const size_t out_bytes[] = {upper}_OUTPUT_BYTES;
  const void* inputs[{upper}_NUM_INPUTS + 1];
  void* outputs[{upper}_NUM_OUTPUTS + 1];
  if (argc != 3) return 3;
  FILE* in = fopen(argv[1], "rb");
  if (!in) return 4;
  for (int i = 0; i < {upper}_NUM_INPUTS; ++i) {{
    void* p = malloc(in_bytes[i] ? in_bytes[i] : 1);
    if (fread(p, 1, in_bytes[i], in) != in_bytes[i]) return 5;
    inputs[i] = p;
  }}
  fclose(in);
  for (int j = 0; j < {upper}_NUM_OUTPUTS; ++j)
    outputs[j] = malloc(out_bytes[j] ? out_bytes[j] : 1);
  size_t arena = ({upper}_TEMP_BYTES + {upper}_TEMP_ALIGNMENT) / {upper}_TEMP_ALIGNMENT
                 * {upper}_TEMP_ALIGNMENT;
  char* temp = aligned_alloc({upper}_TEMP_ALIGNMENT, arena);
  if ({upper}_NUM_INPUTS && {name}_run(NULL, outputs, temp) != {null_array}) return 6;
  if ({upper}_TEMP_BYTES && {name}_run(inputs, outputs, temp + 1) != {bad_temp}) return 7;
  int status = {name}_run(inputs, outputs, {upper}_TEMP_BYTES ? temp : NULL);
  if (status != 0) {{
    fprintf(stderr, "{name}_run returned %d\n", status);
    return 8;
  }}
  FILE* out = fopen(argv[2], "wb");
  for (int j = 0; j < {upper}_NUM_OUTPUTS; ++j)
    if (fwrite(outputs[j], 1, out_bytes[j], out) != out_bytes[j]) return 9;
  fclose(out);
  return 0;
}}
"""

# Shared libraries a program linked against a library may name: libc, libm, libgomp and
# OpenBLAS (gcc adds libgcc_s only where a program needs it).
ALLOWED_SHARED = ("libc.so", "libm.so", "libgomp.so", "libscipy_openblas", "libopenblas",
                  "libgcc_s")


def compiler() -> str:
    """The system C compiler, or skip the test."""
    found = shutil.which("cc") or shutil.which("gcc")
    if found is None:
        pytest.skip("no C compiler (cc, gcc) on this machine")
    return found


def blas_file() -> str:
    """The OpenBLAS shared library NumPy ships (what `engine.gemm` binds)."""
    root = Path(np.__file__).parent.parent / "numpy.libs"
    found = sorted(glob.glob(str(root / "lib*openblas*.so*")))
    if not found:
        pytest.skip("NumPy's OpenBLAS is not where its wheel puts it")
    return found[0]


def build(library: AotLibrary, directory: Path) -> Path:
    """Write the library, compile and link the program against it; the program's path."""
    library.write(str(directory / library.name))
    source = directory / "main.c"
    source.write_text(_PROGRAM.format(name=library.name, upper=library.name.upper(),
                                      null_array=RUN_NULL_ARRAY, bad_temp=RUN_BAD_TEMP))
    program = directory / "main"
    command = [compiler(), "-std=c11", "-O1", "-Wall", "-Werror", str(source),
               str(directory / f"{library.name}.o"), "-o", str(program), *link_flags(library)]
    if "openblas" in library.libraries:
        blas = blas_file()
        command += [blas, f"-Wl,-rpath,{os.path.dirname(blas)}"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return program


def run(program: Path, library: AotLibrary, inputs: list[np.ndarray], threads: int = 2
        ) -> list[np.ndarray]:
    """Run the program on `inputs` (`OMP_NUM_THREADS=threads`); the library's results."""
    directory = program.parent
    (directory / "inputs.bin").write_bytes(
        b"".join(np.ascontiguousarray(a, dtype=s.numpy_dtype).tobytes()
                 for a, s in zip(inputs, library.parameter_shapes)))
    done = subprocess.run([str(program), str(directory / "inputs.bin"),
                           str(directory / "outputs.bin")], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", ""),
                               "OMP_NUM_THREADS": str(threads)})
    assert done.returncode == 0, f"status {done.returncode}: {done.stderr}"
    data = (directory / "outputs.bin").read_bytes()
    results, at = [], 0
    for shape in library.output_shapes:
        results.append(np.frombuffer(data[at:at + shape.byte_size],
                                     dtype=shape.numpy_dtype).reshape(shape.dims))
        at += shape.byte_size
    assert at == len(data)
    return results


def shared_libraries(program: Path) -> list[str]:
    """The shared libraries `program` itself names (its NEEDED entries; what those load in
    turn, such as OpenBLAS's Fortran runtime, is theirs)."""
    if shutil.which("readelf") is None:
        pytest.skip("no readelf on this machine")
    listing = subprocess.run(["readelf", "-d", str(program)], capture_output=True, text=True,
                             check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", listing)


def object_symbols(path: Path, *flags: str) -> list[str]:
    """The object's symbols as `nm` lists them with `flags` (`-u`: undefined ones;
    `-g --defined-only`: those it exports)."""
    if shutil.which("nm") is None:
        pytest.skip("no nm on this machine")
    listing = subprocess.run(["nm", *flags, str(path)], capture_output=True, text=True,
                             check=True).stdout
    return sorted(line.split()[-1] for line in listing.splitlines() if line.strip())
