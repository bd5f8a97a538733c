"""Real data sources for the initializers' tests, run on this machine: an S3 server (:mod:`.s3`, VersityGW built
from its Go module) and a Hugging Face Hub-compatible server (:mod:`.hub`) that the real ``boto3`` and
``huggingface_hub`` clients talk to."""
