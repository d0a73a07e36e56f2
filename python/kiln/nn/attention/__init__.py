"""kiln.nn.attention (torch.nn.attention): FlexAttention lives in kiln.nn.attention.flex_attention."""
from . import flex_attention  # noqa: F401
