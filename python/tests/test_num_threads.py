"""kiln.set_num_threads / kiln.get_num_threads: results never depend on the thread count, small and
large ops alike, and the setting reaches ops run from other Python threads."""
import threading

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F


def ops(x, w):
    return [x * x, kiln.exp(x), x.sum(-1), F.softmax(x, -1), F.linear(x, w)]


def test_results_do_not_depend_on_the_thread_count():
    saved = kiln.get_num_threads()
    try:
        for shape in ((64, 64), (1024, 512)):  # below and above every grain
            x, w = kiln.randn(*shape), kiln.randn(256, shape[1])
            kiln.set_num_threads(1)
            one = [t.numpy().copy() for t in ops(x, w)]
            kiln.set_num_threads(3)
            assert kiln.get_num_threads() == 3
            for a, b in zip(ops(x, w), one):
                np.testing.assert_array_equal(a.numpy(), b)
    finally:
        kiln.set_num_threads(saved)
    with pytest.raises(ValueError, match="positive"):
        kiln.set_num_threads(0)


def test_the_setting_reaches_other_threads():
    saved = kiln.get_num_threads()
    try:
        kiln.set_num_threads(1)
        seen = []
        t = threading.Thread(target=lambda: seen.append(kiln.get_num_threads()))
        t.start()
        t.join()
        assert seen == [1]
    finally:
        kiln.set_num_threads(saved)
