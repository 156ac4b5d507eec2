"""The time budget's clock (training/stopping.py): one process reads its own; several agree on
process 0's. Injected clocks, no JAX computation."""

from transformer_jax.training.stopping import TimeBudget


class FakeClock:
  def __init__(self, speed: float):
    self.speed, self.seconds = speed, 1000.0

  def advance(self, seconds: float):
    self.seconds += seconds * self.speed

  def __call__(self) -> float:
    return self.seconds


def test_one_process_reads_its_own_clock_at_every_step():
  clock = FakeClock(1.0)
  budget = TimeBudget(2.0, prior_minutes=0.5, clock=clock, shared=False)
  clock.advance(60)
  assert budget.minutes(step=3) == 1.5 and not budget.spent(3)
  clock.advance(30)
  assert budget.minutes(step=4) == 2.0 and budget.spent(4)
  assert budget.seconds_left(4) == 0.0


def test_hosts_whose_clocks_disagree_stop_at_the_same_step_with_the_same_minutes():
  """Host 1's clock runs 50 times fast; every value either host uses comes from host 0's
  readings at logging steps (every 10 steps), extrapolated in between by the last interval's
  minutes per step."""
  clocks = [FakeClock(1.0), FakeClock(50.0)]
  hosts = []
  for clock in clocks:
    hosts.append(TimeBudget(1.0, prior_minutes=0.0, start_step=0, clock=clock, shared=True,
                            broadcast=lambda _: hosts[0]._local_minutes()))
  seen = [[], []]
  stopped = [None, None]
  for step in range(1, 400):
    for clock in clocks:
      clock.advance(0.5)  # 0.5 s a step on host 0: the budget (60 s) ends at step 120
    for i, budget in enumerate(hosts):
      if step % 10 == 0:
        budget.agree(step)
      seen[i].append(budget.minutes(step))
      if stopped[i] is None and budget.spent(step):
        stopped[i] = step
  assert seen[0] == seen[1]  # the cooldown factor follows the same minutes on both hosts
  assert stopped[0] == stopped[1] and 120 <= stopped[0] <= 130
  assert seen[0][8] == 0.0  # step 9, before the first agreement: the prior minutes
  assert abs(seen[0][59] - 0.5) < 1e-6  # step 60: 30 s of host 0's clock
  # Without agreeing, host 1's own clock would have ended its budget at step 3.
  alone = TimeBudget(1.0, 0.0, clock=FakeClock(50.0), shared=False)
  alone.clock.advance(0.5 * 3)
  assert alone.spent(3)
