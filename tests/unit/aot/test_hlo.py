"""Reading an optimised HLO module: collectives per step with loop trips applied, loops and
their trip counts, the shapes a collective produces."""

import pytest

from transformer_jax.aot import hlo

MODULE = """HloModule jit_step, entry_computation_layout={()->f32[]}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%body (p: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %p = (s32[], f32[8,128]{1,0:T(8,128)}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[8,128]{1,0:T(8,128)} get-tuple-element(%p), index=1
  %ar = f32[8,128]{1,0:T(8,128)} all-reduce(%v), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  ROOT %t = (s32[], f32[8,128]{1,0:T(8,128)}) tuple(%i, %ar)
}

%cond (p: (s32[], f32[8,128])) -> pred[] {
  %p = (s32[], f32[8,128]{1,0:T(8,128)}) parameter(0)
  %c = s32[]{:T(128)} constant(6)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%open_cond (p: (s32[], f32[8,128])) -> pred[] {
  %p = (s32[], f32[8,128]{1,0:T(8,128)}) parameter(0)
  %c = s32[] constant(6)
  %i = s32[] get-tuple-element(%p), index=0
  %lt = pred[] compare(%i, %c), direction=LT
  %flag = pred[] constant(true)
  ROOT %and = pred[] and(%lt, %flag)
}

%all-reduce-scatter (input: f32[16,128]) -> f32[4,128] {
  %input = f32[16,128]{1,0} parameter(0)
  %whole = f32[16,128]{1,0} all-reduce(%input), replica_groups={{0,1,2,3}}, to_apply=%add
  %pid = u32[] partition-id()
  %four = u32[] constant(4)
  %at = u32[] multiply(%pid, %four)
  %zero = u32[] constant(0)
  ROOT %piece = f32[4,128]{1,0} dynamic-slice(%whole, %at, %zero), dynamic_slice_sizes={4,128}
}

ENTRY %main (a: f32[16,128], w: bf16[4,64]) -> f32[] {
  %a = f32[16,128]{1,0} parameter(0)
  %w = bf16[4,64]{1,0} parameter(1)
  %ag-start = (bf16[4,64], bf16[8,64]) all-gather-start(%w), dimensions={0}
  %ag = bf16[8,64]{1,0} all-gather-done(%ag-start)
  %both = (f32[16,128]{1,0}, f32[]) all-reduce(%a, %a), to_apply=%add
  %g0 = f32[16,128]{1,0} get-tuple-element(%both), index=0
  %z = s32[] constant(0)
  %ds = f32[8,128]{1,0} dynamic-slice(%g0, %z, %z), dynamic_slice_sizes={8,128}
  %init = (s32[], f32[8,128]{1,0:T(8,128)}) tuple(%z, %ds)
  %loop = (s32[], f32[8,128]{1,0:T(8,128)}) while(%init), condition=%cond, body=%body
  %search = (s32[], f32[8,128]{1,0:T(8,128)}) while(%init), condition=%open_cond, body=%body
  %rs = f32[4,128]{1,0} fusion(%a), kind=kCustom, calls=%all-reduce-scatter
  ROOT %r = f32[] constant(0)
}
"""


def test_shape_bytes_adds_a_tuples_arrays():
  assert hlo.shape_bytes("(f32[8,128]{1,0:T(8,128)}, /*index=1*/bf16[4]{0}, s32[])") == \
      8 * 128 * 4 + 4 * 2 + 4


def test_a_loop_counted_up_to_a_constant_has_that_many_trips_and_an_open_one_none():
  loops = {loop.name: loop.trips for loop in hlo.Module.parse(MODULE).loops()}
  assert loops == {"loop": 6, "search": None}
  # the GPU compiler records the count it found (its condition then reads otherwise)
  recorded = MODULE.replace("condition=%open_cond, body=%body",
                            'condition=%open_cond, body=%body, '
                            'backend_config={"known_trip_count":{"n":"4"}}')
  assert {lp.name: lp.trips for lp in hlo.Module.parse(recorded).loops()}["search"] == 4
  assert hlo.Module.parse(recorded).collectives()["all-reduce"].count == 1 + 6 + 4


def test_collectives_count_each_run_of_a_loop_body_and_async_ones_once():
  found = hlo.Module.parse(MODULE).collectives()
  # entry: one all-reduce (a tuple of two); the body's: 6 trips + 1 (the open loop, once)
  assert found["all-reduce"].count == 1 + 6 + 1
  assert found["all-reduce"].bytes == (16 * 128 * 4 + 4) + 7 * 8 * 128 * 4
  assert (found["all-gather"].count, found["all-gather"].bytes) == (1, 8 * 64 * 2)
  assert found["all-to-all"].count == 0
  # the TPU compiler's reduce-scatter: a fusion that all-reduces and keeps its slice
  assert (found["reduce-scatter"].count, found["reduce-scatter"].bytes) == (1, 4 * 128 * 4)


def test_the_collectives_result_shapes_are_listed():
  module = hlo.Module.parse(MODULE)
  assert (16, 128) in module.result_shapes("all-reduce")
  assert module.result_shapes("reduce-scatter") == [(4, 128)]
  assert module.result_shapes("all-gather") == [(8, 64)]


def test_text_without_an_entry_is_refused():
  with pytest.raises(ValueError, match="ENTRY"):
    hlo.Module.parse("HloModule nothing\n")


TRAFFIC = """HloModule jit_step

%fused (p: f32[256]) -> f32[256] {
  %p = f32[256] parameter(0)
  ROOT %n = f32[256] negate(%p)
}

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[256] get-tuple-element(%p), index=1
  %f = f32[256] fusion(%v), kind=kLoop, calls=%fused, metadata={op_name="LOSS"}
  ROOT %t = (s32[], f32[256]) tuple(%i, %f)
}

%cond (p: (s32[], f32[256])) -> pred[] {
  %p = (s32[], f32[256]) parameter(0)
  %c = s32[] constant(4)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[256]) -> f32[256] {
  %a = f32[256]{0} parameter(0)
  %cs = (f32[256]{0:S(1)}, f32[256]{0}, u32[]) copy-start(%a)
  %cd = f32[256]{0:S(1)} copy-done(%cs)
  %q = f32[256]{0} fusion(%cd), kind=kLoop, calls=%fused, metadata={op_name="ATTENTION"}
  %r = f32[256]{0} copy(%q)
  %z = s32[] constant(0)
  %init = (s32[], f32[256]) tuple(%z, %r)
  %loop = (s32[], f32[256]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[256]{0} get-tuple-element(%loop), index=1
}
""".replace("LOSS", "jit(train_step)/jvp()/output_loss/while/body/closed_call/exp").replace(
    "ATTENTION", "jit(train_step)/Transformer/encoder_0/attention_block/self_attention/mul")


def test_traffic_is_counted_by_block_with_loop_trips_and_without_the_compilers_staging():
  found = hlo.Module.parse(TRAFFIC).traffic_by_block()
  array = 256 * 4
  assert found["attention"] == 2 * array                        # read + write, once
  assert found["output layer and loss"] == 4 * 2 * array        # the loss loop's 4 trips
  condition = 1 + 4 + 4                                         # (the loop's i < 4, unnamed)
  assert found[hlo.COMPILER_MOVES] == 2 * array + condition     # the relayout copy
  assert sum(found.values()) == 12 * array + condition          # (no prefetch counted)


def test_the_compilers_estimated_cycles_are_summed_by_block_with_loop_trips():
  def estimate(cycles):
    return ', backend_config={"window_config":{"estimated_cycles":"%d"}}' % cycles
  loss = ', metadata={op_name="jit(train_step)/jvp()'
  text = (TRAFFIC.replace("calls=%fused" + loss, "calls=%fused" + estimate(300) + loss)
          .replace("%q = f32[256]{0} fusion(%cd), kind=kLoop, calls=%fused",
                   "%q = f32[256]{0} fusion(%cd), kind=kLoop, calls=%fused" + estimate(1000))
          .replace("copy(%q)", "copy(%q)" + estimate(7))
          .replace("  %r = ", "  %s = f32[256]{0} all-reduce-start(%q)" + estimate(50)
                   + ', metadata={op_name="jit(train_step)/Transformer/attention/add"}\n  %r = '))
  found = hlo.Module.parse(text).cycles_by_block()
  assert (found["attention"], found["output layer and loss"]) == (1000, 4 * 300)
  assert found[hlo.COMPILER_MOVES] == 7
  assert found["collectives"] == 50  # (an async collective's start: not its op_name's block)
  assert hlo.Module.parse(TRAFFIC).cycles_by_block() == {}  # (none recorded: XLA:CPU's)
