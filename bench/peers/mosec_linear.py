"""Mosec serving the ``linear`` workload (nn.Linear(4, 2)) as batchserve does: JSON
``{"instances": [[4 floats]]}`` in, ``{"predictions": [[2 floats]]}`` out, batches of up to 32
gathered for up to 5 ms, one torch thread. Run by bench/peers.py in its own environment:
``python bench/peers/mosec_linear.py --port P --metrics-port M``."""

from __future__ import annotations

import torch
from mosec import Server, Worker


class Linear(Worker):
    def __init__(self) -> None:
        super().__init__()
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2).eval()

    def forward(self, data: list[dict]) -> list[dict]:  # type: ignore[override]
        x = torch.tensor([d["instances"][0] for d in data], dtype=torch.float32)
        with torch.inference_mode():
            y = self.model(x)
        return [{"predictions": [row]} for row in y.tolist()]


if __name__ == "__main__":
    server = Server()
    server.append_worker(Linear, max_batch_size=32, max_wait_time=5)
    server.run()
