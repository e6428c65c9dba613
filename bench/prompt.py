"""``python -m bench.prompt``: a front end (app/frontend/entry.py) whose every message to the
device process goes at the end of the pass that made it, for ``python -m bench.frontends
--prompt-frontends`` (bench/switch.py starts each front end so).

A front end with ``link.BUSY_AT`` requests or more waiting sends a pass's message at the end of
the next pass instead, with what that pass read: fewer, larger messages for the device process,
whose cost is mostly per message (docs/frontends.md, "A busy front end's message waits one
pass"). That was measured on the 2-core box, where the device process shares the front ends'
cores. On the GPU box at N=8 the device process was not the bound, the round trip was
(docs/frontends.md): a message that waits a pass also waits for what that pass does, the
answers of another batch rendered. This measures the wait there.
"""

from __future__ import annotations

import sys

from app.frontend import entry, link

if __name__ == "__main__":
    link.BUSY_AT = sys.maxsize  # never busy: each message goes at its pass's end
    sys.exit(entry.main())
