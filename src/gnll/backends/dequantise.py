"""Write a float32 copy of a quantised GGUF file: the weights the in-process backend computes with.

The hf backend de-quantises an embedded model's GGUF to float32 once (see
:mod:`gnll.backends.embedded`). A llama.cpp server given the quantised file computes with other
numbers (it quantises the activations of every matrix product with quantised weights to 8 bits), so
its answers part from the hf backend's at near-ties. Serving this float32 copy instead gives both
paths the same weights and the same precision, which makes the server's G-NLL checkable against the
in-process one (scripts/server_agreement.py ``--float32``; docs/servers.md).
"""

from __future__ import annotations

from pathlib import Path

#: ``general.file_type`` of a file whose tensors are all float32 (llama.cpp's LLAMA_FTYPE_ALL_F32).
ALL_F32 = 0


def dequantised_gguf(source: Path, target: Path) -> Path:
    """Copy ``source`` to ``target`` with every tensor de-quantised to float32.

    Parameters
    ----------
    source : Path
        A GGUF file, quantised or not.
    target : Path
        Where to write the copy; its directory must exist.

    Returns
    -------
    Path
        ``target``. Every key-value field is copied unchanged except ``general.file_type``, which
        becomes 0 (all float32); the tensors keep their names, shapes and order.
    """
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* header fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = ALL_F32 if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        # dequantize returns the numpy (row-major) shape; the writer reverses it into GGML order.
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
