"""LitServe serving the ``linear`` workload as batchserve does (see mosec_linear.py): batches of
up to 32 gathered for up to 5 ms, one torch thread. Run by bench/peers.py in its own environment:
``python bench/peers/litserve_linear.py --port P``."""

from __future__ import annotations

import sys
from typing import Any

import litserve as ls
import torch


class Linear(ls.LitAPI):
    def setup(self, device: str) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2).eval()

    # Unannotated: LitServe then reads the JSON body (an annotation can make it a query).
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return request["instances"][0]

    def batch(self, inputs: list[list[float]]) -> torch.Tensor:
        return torch.tensor(inputs, dtype=torch.float32)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(x)

    def unbatch(self, output: torch.Tensor) -> list[list[float]]:
        return output.tolist()

    def encode_response(self, output: list[float]) -> dict[str, Any]:
        return {"predictions": [output]}


if __name__ == "__main__":
    api = Linear(max_batch_size=32, batch_timeout=0.005)
    ls.LitServer(api, accelerator="cpu", devices=1).run(
        host="127.0.0.1", port=int(sys.argv[sys.argv.index("--port") + 1]),
        generate_client_file=False, log_level="warning")
