"""batchserve's own protobuf descriptor pool for the gRPC messages (app/grpc/inference_pb2.py).

tritonclient.grpc registers the same ``inference.*`` message names in protobuf's default pool;
in a pool of their own, ours never collide with them in one program.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
