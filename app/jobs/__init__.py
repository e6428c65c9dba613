"""Job-queue mode on Redis Streams: ``protocol`` (the job format), ``client`` (submitting, no
torch), ``worker`` (a JobWorker on a running service) and ``runner`` (``batchserve worker``)."""
