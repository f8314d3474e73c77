"""The extension module `uform._engine`: the Device type and every kernel's entry point.

Python passes buffers as integer addresses on a device (see python/uform/engine.py,
which wraps numpy arrays and device allocations) and sizes as integers.
"""

from std.os import abort
from std.python import PythonObject
from std.python.bindings import PythonModuleBuilder
from engine.device import Device, gpu_device_count
from engine.launch import device_of, launch_from_python
from engine.target import HAS_ACCELERATOR
from kernels import adamw, attention, contrastive, embedding, gemm, norms, pointwise, rotary


# ---- the Device type -------------------------------------------------------------------

def device_open(py_self: PythonObject, ordinal: PythonObject) raises -> PythonObject:
    device_of(py_self)[].open(Int(py=ordinal))
    return PythonObject(None)


def device_ordinal(py_self: PythonObject) raises -> PythonObject:
    return PythonObject(device_of(py_self)[].ordinal)


def device_alloc(py_self: PythonObject, size: PythonObject) raises -> PythonObject:
    return PythonObject(device_of(py_self)[].alloc(Int(py=size)))


def device_free(py_self: PythonObject, address: PythonObject) raises -> PythonObject:
    device_of(py_self)[].free(Int(py=address))
    return PythonObject(None)


def device_upload(py_self: PythonObject, address: PythonObject, host: PythonObject, size: PythonObject) raises -> PythonObject:
    device_of(py_self)[].upload(Int(py=address), Int(py=host), Int(py=size))
    return PythonObject(None)


def device_download(py_self: PythonObject, host: PythonObject, address: PythonObject, size: PythonObject) raises -> PythonObject:
    device_of(py_self)[].download(Int(py=host), Int(py=address), Int(py=size))
    return PythonObject(None)


def device_copy(py_self: PythonObject, destination: PythonObject, source: PythonObject, size: PythonObject) raises -> PythonObject:
    device_of(py_self)[].copy(Int(py=destination), Int(py=source), Int(py=size))
    return PythonObject(None)


def device_synchronize(py_self: PythonObject) raises -> PythonObject:
    device_of(py_self)[].synchronize()
    return PythonObject(None)


# ---- module facts ----------------------------------------------------------------------

def gpu_count() raises -> PythonObject:
    return PythonObject(gpu_device_count())


def has_accelerator() raises -> PythonObject:
    return PythonObject(HAS_ACCELERATOR)


@export
def PyInit__engine() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("_engine")
        _ = (
            m.add_type[Device]("Device")
            .def_init_defaultable[Device]()
            .def_method[device_open]("open")
            .def_method[device_ordinal]("ordinal")
            .def_method[device_alloc]("alloc")
            .def_method[device_free]("free")
            .def_method[device_upload]("upload")
            .def_method[device_download]("download")
            .def_method[device_copy]("copy")
            .def_method[device_synchronize]("synchronize")
        )
        m.def_function[gpu_count]("gpu_count")
        m.def_function[has_accelerator]("has_accelerator")
        m.def_function[gemm.gemm]("gemm")
        m.def_function[gemm.gemm_chunks]("gemm_chunks")
        m.def_function[launch_from_python[pointwise.unary_math]]("unary_math")
        m.def_function[launch_from_python[pointwise.silu_backward]]("silu_backward")
        m.def_function[launch_from_python[pointwise.add]]("add")
        m.def_function[launch_from_python[pointwise.scale]]("scale")
        m.def_function[launch_from_python[pointwise.fill]]("fill")
        m.def_function[launch_from_python[norms.rmsnorm_forward]]("rmsnorm_forward")
        m.def_function[launch_from_python[norms.rmsnorm_backward]]("rmsnorm_backward")
        m.def_function[launch_from_python[norms.softmax_forward]]("softmax_forward")
        m.def_function[launch_from_python[norms.softmax_backward]]("softmax_backward")
        m.def_function[launch_from_python[norms.cross_entropy]]("cross_entropy")
        m.def_function[launch_from_python[norms.column_partial_sums]]("column_partial_sums")
        m.def_function[launch_from_python[norms.column_sums_finish]]("column_sums_finish")
        m.def_function[attention.attention_forward]("attention_forward")
        m.def_function[launch_from_python[attention.attention_backward_delta]]("attention_backward_delta")
        m.def_function[attention.attention_backward_dq]("attention_backward_dq")
        m.def_function[attention.attention_backward_dv]("attention_backward_dv")
        m.def_function[attention.attention_backward_dk]("attention_backward_dk")
        m.def_function[launch_from_python[rotary.rotary]]("rotary")
        m.def_function[launch_from_python[embedding.embedding_forward]]("embedding_forward")
        m.def_function[launch_from_python[embedding.embedding_backward]]("embedding_backward")
        m.def_function[launch_from_python[adamw.adamw]]("adamw")
        m.def_function[launch_from_python[contrastive.pool_forward]]("pool_forward")
        m.def_function[launch_from_python[contrastive.pool_backward]]("pool_backward")
        m.def_function[launch_from_python[contrastive.l2_normalize_forward]]("l2_normalize_forward")
        m.def_function[launch_from_python[contrastive.l2_normalize_backward]]("l2_normalize_backward")
        m.def_function[launch_from_python[contrastive.row_temperature]]("row_temperature")
        m.def_function[launch_from_python[contrastive.pair_loss]]("pair_loss")
        m.def_function[launch_from_python[contrastive.group_sums]]("group_sums")
        return m.finalize()
    except e:
        abort(String("failed to create module _engine: ", e))
