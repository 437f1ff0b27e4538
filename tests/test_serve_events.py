"""events.post / batched_posts: the engine thread's hand-over of events to
an asyncio loop (a real loop in its own thread)."""

import asyncio
import threading

from flash_dllm_jax.serve.events import batched_posts, post


def test_a_step_hands_each_loop_its_posts_in_order_with_one_wakeup():
  loop = asyncio.new_event_loop()
  thread = threading.Thread(target=loop.run_forever, daemon=True)
  thread.start()
  got, wakeups = [], []
  plain = loop.call_soon_threadsafe
  loop.call_soon_threadsafe = lambda *a: (wakeups.append(a), plain(*a))[1]

  def settle():  # the loop ran what was handed to it
    ran = threading.Event()
    plain(ran.set)
    assert ran.wait(5)

  try:
    post(loop, got.append, 0)  # outside a step: at once
    with batched_posts():
      for i in range(1, 6):
        post(loop, got.append, i)
      assert len(wakeups) == 1  # held until the step ends
    settle()
    assert got == [0, 1, 2, 3, 4, 5] and len(wakeups) == 2
    try:  # a step that fails still hands over what it posted
      with batched_posts():
        post(loop, got.append, 6)
        raise RuntimeError("step failed")
    except RuntimeError:
      pass
    post(loop, got.append, 7)
    settle()
    assert got == list(range(8)) and len(wakeups) == 4
  finally:
    plain(loop.stop)
    thread.join(5)
    loop.close()
