"""LinearCrossEntropyLoss refuses non-positive or non-integer sizes, naming the class and argument."""
import pytest

import kiln


@pytest.mark.parametrize("bad", [-8, 0])
def test_non_positive_sizes_name_the_argument(bad):
    with pytest.raises(ValueError, match=rf"LinearCrossEntropyLoss: in_features must be a positive integer, got {bad}"):
        kiln.nn.LinearCrossEntropyLoss(bad, 10)
    with pytest.raises(ValueError, match=rf"LinearCrossEntropyLoss: num_classes must be a positive integer, got {bad}"):
        kiln.nn.LinearCrossEntropyLoss(10, bad)


def test_non_integer_size_is_refused():
    with pytest.raises(ValueError, match="in_features must be a positive integer, got 2.5"):
        kiln.nn.LinearCrossEntropyLoss(2.5, 10)
    assert tuple(kiln.nn.LinearCrossEntropyLoss(8, 10).weight.shape) == (10, 8)
