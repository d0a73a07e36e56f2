#pragma once
// Engine state visible to backward closures (internal).

namespace kiln::autograd::detail {

// True while a backward runs that frees each node after it ran (no retain_graph/create_graph):
// a closure may then hand its saved buffers out as gradients, or overwrite them, because it will
// never run again.
bool graph_freed_after_use();

}  // namespace kiln::autograd::detail
