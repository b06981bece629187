"""HLO texts shaped like what XLA and JAX print today, for the parser's tests.

Written for these tests after the form of XLA's printer (`hlo_module.cc`,
`hlo_instruction.cc`) and of public dumps: a JAX-lowered module in the short form
with stack-frame tables, a scheduled optimized dump with fusions, tiled layouts and
XLA's attributes, and a module of async and copy wrappers (which parse but do not run).
"""
# ruff: noqa: E501  (XLA prints each instruction on one line, however long)

from __future__ import annotations

# jax.jit(f).lower(x, w).as_text(dialect="hlo") style: short names, tables first,
# `stack_frame_id` in the metadata, module frontend attributes, shardings.
JAX_LOWERED = """\
HloModule jit_f, entry_computation_layout={(f32[2,3]{1,0}, f32[3,4]{1,0})->(f32[2,4]{1,0}, f32[2]{0})}, allow_spmd_sharding_propagation_to_output={true,false}, frontend_attributes={xla.sdy.meshes="{}"}

FileNames
1 "/home/user/model.py"
2 "/usr/lib/python3/site-packages/jax/_src/api.py"

FunctionNames
1 "f"
2 "<module>"

FileLocations
1 {file_name_id=1 function_name_id=1 line=12 end_line=12 column=11 end_column=26}
2 {file_name_id=1 function_name_id=2 line=20 end_line=20 column=0 end_column=14}
3 {file_name_id=1 function_name_id=1 line=13 end_line=13 column=9 end_column=22}

StackFrames
1 {file_location_id=2 parent_frame_id=0}
2 {file_location_id=1 parent_frame_id=1}
3 {file_location_id=3 parent_frame_id=1}

region_0.7 {
  Arg_0.8 = f32[] parameter(0)
  Arg_1.9 = f32[] parameter(1)
  ROOT add.10 = f32[] add(Arg_0.8, Arg_1.9), metadata={op_name="jit(f)/reduce_sum" stack_frame_id=3}
}

ENTRY main.14 {
  Arg_0.1 = f32[2,3]{1,0} parameter(0), sharding={replicated}, metadata={op_name="x"}
  Arg_1.2 = f32[3,4]{1,0} parameter(1), sharding={devices=[1,2]<=[2]}, metadata={op_name="w"}
  dot.3 = f32[2,4]{1,0} dot(Arg_0.1, Arg_1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={default,default}, frontend_attributes={_xla_compute_type="dense"}, metadata={op_name="jit(f)/dot_general" source_file="/home/user/model.py" source_line=12 source_end_line=12 source_column=11 source_end_column=26 stack_frame_id=2}
  tanh.4 = f32[2,4]{1,0} tanh(dot.3), metadata={op_name="jit(f)/tanh" stack_frame_id=2}
  constant.5 = f32[] constant(0)
  reduce.11 = f32[2]{0} reduce(tanh.4, constant.5), dimensions={1}, to_apply=region_0.7, metadata={op_name="jit(f)/reduce_sum" stack_frame_id=3}
  ROOT tuple.13 = (f32[2,4]{1,0}, f32[2]{0}) tuple(tanh.4, reduce.11), sharding={{replicated}, {maximal device=0}}
}
"""

# XLA's optimized, scheduled dump (`--xla_dump_to`, after_optimizations.txt) in the long
# form: tables, `is_scheduled`, tiled and memory-space layouts, fusions with backend
# configs, bitcasts that are reshapes, `origin`, `statistics`, XLA's newer metadata keys.
XLA_SCHEDULED = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0:T(8,128)}, f32[8]{0:T(256)S(1)})->f32[32]{0}}, frontend_attributes={fingerprint_before_lhs="3f1c"}

FileNames
1 "train.py"

FunctionNames
1 "step"

FileLocations
1 {file_name_id=1 function_name_id=1 line=7 end_line=7 column=4 end_column=19}

StackFrames
1 {file_location_id=1 parent_frame_id=0}

%fused_computation (param_0: f32[4,8], param_1: f32[8]) -> f32[4,8] {
  %param_0 = f32[4,8]{1,0:T(8,128)} parameter(0)
  %param_1 = f32[8]{0:T(256)S(1)} parameter(1)
  %broadcast.1 = f32[4,8]{1,0:T(8,128)} broadcast(f32[8]{0:T(256)S(1)} %param_1), dimensions={1}
  %multiply.1 = f32[4,8]{1,0:T(8,128)} multiply(f32[4,8]{1,0:T(8,128)} %param_0, f32[4,8]{1,0:T(8,128)} %broadcast.1), metadata={op_name="jit(step)/mul" stack_frame_id=1 deduplicated_name="multiply" scheduling_name="multiply.1"}
  ROOT %exponential.1 = f32[4,8]{1,0:T(8,128)} exponential(f32[4,8]{1,0:T(8,128)} %multiply.1), metadata={op_name="jit(step)/exp" stack_frame_id=1 preserve_layout=true}
}

ENTRY %main.9 (Arg_0.1: f32[4,8], Arg_1.2: f32[8]) -> f32[32] {
  %Arg_0.1 = f32[4,8]{1,0:T(8,128)} parameter(0), origin={{"x"}}, metadata={op_name="x"}
  %Arg_1.2 = f32[8]{0:T(256)S(1)} parameter(1), origin={{"scale"}}
  %fusion = f32[4,8]{1,0:T(8,128)} fusion(f32[4,8]{1,0:T(8,128)} %Arg_0.1, f32[8]{0:T(256)S(1)} %Arg_1.2), kind=kLoop, calls=%fused_computation, backend_config={"flag_configs":[],"scoped_memory_configs":[],"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"1024"}]}, statistics={visualizing_index=1,stat-1=33,stat-2=44}
  %copy = f32[4,8]{1,0:T(8,128)S(1)} copy(f32[4,8]{1,0:T(8,128)} %fusion)
  %bitcast.2 = f32[4,8]{1,0:T(8,128)} bitcast(f32[4,8]{1,0:T(8,128)S(1)} %copy), metadata={op_name="jit(step)/reshape" stack_frame_id=1}
  %copy.1 = f32[4,8]{1,0} copy(f32[4,8]{1,0:T(8,128)} %bitcast.2)
  ROOT %bitcast.3 = f32[32]{0} bitcast(f32[4,8]{1,0} %copy.1), metadata={op_name="jit(step)/reshape" stack_frame_id=1}
}
"""

# Wrappers XLA's scheduler and memory-space assignment insert; the IR keeps them as
# written, and nothing evaluates or compiles them.
ASYNC_WRAPPERS = """\
HloModule async_wrappers, is_scheduled=true, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%wrapped_negate (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(f32[4]{0} %p)
}, execution_thread="parallel_thread"

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %copy-start = (f32[4]{0:S(1)}, f32[4]{0}, u32[]) copy-start(f32[4]{0} %x), cross_program_prefetch_index=0
  %copy-done = f32[4]{0:S(1)} copy-done((f32[4]{0:S(1)}, f32[4]{0}, u32[]) %copy-start)
  %async-start = ((f32[4]{0}), f32[4]{0}, s32[]) async-start(f32[4]{0} %copy-done), async_execution_thread="parallel_thread", calls=%wrapped_negate
  %async-done = f32[4]{0} async-done(((f32[4]{0}), f32[4]{0}, s32[]) %async-start)
  ROOT %custom-call = f32[4]{0} custom-call(f32[4]{0} %async-done), custom_call_target="my_ffi", api_version=API_VERSION_TYPED_FFI, operand_layout_constraints={f32[4]{0}}, backend_config={"k":1}
}
"""
