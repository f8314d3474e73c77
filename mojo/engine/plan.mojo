"""Plans: a model's kernel launches recorded once and replayed with no Python per launch.

Every kernel's Python entry point ends in one `Launcher`: the function that runs the kernel's tasks
[0, n) with its operands on a device (`launch_index[body]`, `launch_rows[body]`, the GEMM's
`launch_product[...]`, ...). Python's `_engine.Device` is a `PlannedDevice`: the `Device` and the
plans recorded on it. While it records (`plan_begin`), an entry point appends (launcher, n,
operands) to the recording instead of running it (`record_or_launch`); `plan_end` keeps the
recording as one of its plans, and `plan_run` replays it:

- on the CPU, and on a GPU when asked, as a loop that calls the same launchers with the same
  operands in the same order (so the same bits as the calls it recorded);
- on a GPU by default, as a `DeviceGraph`: the loop above is run once against the graph builder's
  recording context (the device's context is swapped for it), so every launch becomes a node in
  stream order, and each replay submits the whole graph at once.

A plan holds addresses, so it reads whatever those buffers hold when it runs: per-step values
(ids, targets, AdamW's bias corrections) live in buffers the caller writes before each replay.
Copies between host and device are never recorded: while a device records, they raise.

The plans sit beside the `Device`, not in it, so the engine's imports run one way: `device` (memory and
queue), `launch` (launchers, which take the `Device`), `plan` (recordings of launchers).
"""

from std.collections import Optional
from std.python import PythonObject
from max.gpu.host import DeviceGraph, DeviceGraphBuilder
from engine.device import Device
from engine.launch import Args, DevicePtr, Launcher
from engine.target import HAS_ACCELERATOR


@fieldwise_init
struct PlanOp(ImplicitlyCopyable, Movable):
    """One recorded launch: the kernel's launcher, its task count and its operands."""

    var launch: Launcher
    var n: Int
    var args: Args


struct Plan(Movable):
    """Recorded launches, and on a GPU the device graph made of them (None: replayed as a loop)."""

    var ops: List[PlanOp]
    var graph: Optional[DeviceGraph]

    def __init__(out self):
        self.ops = List[PlanOp]()
        self.graph = None


struct PlannedDevice(Movable, Writable, Defaultable):
    """A device and the plans recorded on it: what Python's `_engine.Device` holds."""

    var device: Device
    var recording: Optional[Plan]  # the plan being recorded, if one is
    var plans: List[Optional[Plan]]  # the recorded plans by id (None: freed)

    def __init__(out self):
        self.device = Device()
        self.recording = None
        self.plans = List[Optional[Plan]]()

    def device_ptr(ref self) -> DevicePtr:
        """The `Device`, as the launchers take it."""
        return DevicePtr(unsafe_from_address=Int(Pointer(to=self.device)))

    def not_recording(self, what: StaticString) raises:
        """Copies run when called, so a plan never holds one: refuse them while a plan is recorded."""
        if self.recording:
            raise Error("a ", what, " while a plan is being recorded on ", self.device, " (copies are not recorded)")

    def write_to[W: Writer](self, mut writer: W):
        self.device.write_to(writer)

    def write_repr_to[W: Writer](self, mut writer: W):
        self.device.write_to(writer)


comptime PlannedDevicePtr = Pointer[PlannedDevice, MutAnyOrigin]


def planned_device_of(py: PythonObject) raises -> PlannedDevicePtr:
    """The `PlannedDevice` behind a Python `_engine.Device` object."""
    return py.downcast_value_ptr[PlannedDevice]()


def device_of(py: PythonObject) raises -> DevicePtr:
    """The `Device` behind a Python `_engine.Device` object."""
    return planned_device_of(py)[].device_ptr()


def record_or_launch[launch: Launcher](planned: PlannedDevicePtr, n: Int, args: Args) raises:
    """Run the launch, or append it to the device's recording if one is open."""
    if planned[].recording:
        planned[].recording.value().ops.append(PlanOp(launch, n, args))
        return
    launch(planned[].device_ptr(), n, args)


def plan_begin(planned: PlannedDevicePtr) raises:
    if planned[].recording:
        raise Error("a plan is already being recorded on ", planned[].device)
    planned[].recording = Plan()


def plan_end(planned: PlannedDevicePtr, graph: Bool) raises -> Int:
    """Close the recording and keep it as a plan; answers its id. graph (a GPU only): replay it as a device
    graph, else as a loop of launches."""
    if not planned[].recording:
        raise Error("no plan is being recorded on ", planned[].device)
    var plan = planned[].recording.take()
    if graph and planned[].device.is_gpu():
        comptime if HAS_ACCELERATOR:
            plan.graph = graph_of(planned[].device_ptr(), plan.ops)
    for id in range(len(planned[].plans)):  # a freed plan's slot is reused
        if not planned[].plans[id]:
            planned[].plans[id] = plan^
            return id
    planned[].plans.append(plan^)
    return len(planned[].plans) - 1


def graph_of(dev: DevicePtr, ops: List[PlanOp]) raises -> DeviceGraph:
    """The device graph of `ops`: each launcher run once with the device's context swapped for the graph
    builder's recording context, so its launches become the graph's nodes, in order."""
    var context = dev[].context.value()

    def build(mut builder: DeviceGraphBuilder) raises {var dev, imm ops}:
        var saved = dev[].context.value()
        dev[].context = builder.recording_context()
        try:
            for op in ops:
                op.launch(dev, op.n, op.args)
        finally:
            dev[].context = saved

    return DeviceGraph.create(context, build)


def plan_run(planned: PlannedDevicePtr, id: Int) raises:
    """Replay plan `id`: its device graph, or its launches in order."""
    if planned[].recording:
        raise Error("cannot run a plan while one is being recorded on ", planned[].device)
    if id < 0 or id >= len(planned[].plans) or not planned[].plans[id]:
        raise Error("plan ", id, " does not exist on ", planned[].device)
    if planned[].plans[id].value().graph:
        planned[].plans[id].value().graph.value().replay()
        return
    var dev = planned[].device_ptr()
    for i in range(len(planned[].plans[id].value().ops)):
        var op = planned[].plans[id].value().ops[i]
        op.launch(dev, op.n, op.args)


def plan_free(planned: PlannedDevicePtr, id: Int) raises:
    if id >= 0 and id < len(planned[].plans):
        planned[].plans[id] = None
