"""The names trainjob shares with Kubernetes, Kubeflow Trainer, JobSet and torchrun, each written once.

Every module that puts one of these names into a manifest, an environment or a status, or reads one back, imports
it from here. This module imports nothing from trainjob, so anything can import it.

>>> TRAINER_NODE, API_VERSION
('node', 'trainer.kubeflow.org/v1alpha1')
>>> JOB_STATUSES
('Queued', 'Created', 'Running', 'Complete', 'Failed', 'Suspended')
"""

from __future__ import annotations

# --- API groups and versions ------------------------------------------------------------------------------------
API_GROUP = "trainer.kubeflow.org"
#: The version's name within the group, as the CRDs list it (``apiVersion`` is :data:`API_VERSION`).
API_VERSION_NAME = "v1alpha1"
API_VERSION = f"{API_GROUP}/{API_VERSION_NAME}"
TRAINJOB_KIND = "TrainJob"
TRAINING_RUNTIME_KIND = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME_KIND = "ClusterTrainingRuntime"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
COSCHEDULING_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
VOLCANO_API_VERSION = "scheduling.volcano.sh/v1beta1"
PYTORCHJOB_API_VERSION = "kubeflow.org/v1"
#: The Kubeflow Trainer release whose API trainjob implements (its newest fields: ``runtimePatches`` v2.2,
#: ``activeDeadlineSeconds`` v2.3); published for the Kubeflow SDK in ConfigMap ``kubeflow-trainer-public``.
KUBEFLOW_TRAINER_VERSION = "v2.3.0"

# --- the trainer ------------------------------------------------------------------------------------------------
#: The replicated job (JobSet) and the container that run the training: one pod per node.
TRAINER_NODE = "node"
TRAINER_JOB = TRAINER_NODE
TRAINER_CONTAINER = TRAINER_NODE
#: The port torchrun's rendezvous (and ``PET_MASTER_PORT``) uses on node 0.
MASTER_PORT = 29500
#: The ``trainjob-ancestor-step`` label value of the trainer's replicated job.
TRAINER_STEP = "trainer"

# --- labels and annotations of Kubeflow Trainer, JobSet, Kubernetes and the gang schedulers ---------------------
TRAINJOB_NAME_LABEL = f"{API_GROUP}/trainjob-name"
ANCESTOR_STEP_LABEL = f"{API_GROUP}/trainjob-ancestor-step"
#: The initializer steps (replicated job, container and ancestor-step label value) and Kubeflow's images for them,
#: which trainjob's operator runs as its own (``python -m trainjob.initializers dataset|model``).
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
KUBEFLOW_INITIALIZER_IMAGES = {
    DATASET_INITIALIZER: "ghcr.io/kubeflow/trainer/dataset-initializer",
    MODEL_INITIALIZER: "ghcr.io/kubeflow/trainer/model-initializer",
}
#: The JSON copy of the runtime a job was started from (kind, name, resourceVersion, labels, spec).
RUNTIME_SNAPSHOT_ANNOTATION = f"{API_GROUP}/runtime-snapshot"
#: Set by JobSet on its Jobs and pods: the JobSet's name.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Set by JobSet on the pods of each replicated job: its name.
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
#: Set by Kubernetes on every pod of an Indexed Job; ``PET_NODE_RANK`` is read from it.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_LABEL = COMPLETION_INDEX_ANNOTATION
COMPLETION_INDEX_FIELD_PATH = f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
#: The framework a runtime runs (``torch``, ``mpi``, ``deepspeed`` ...), as the Kubeflow SDK reads it.
FRAMEWORK_LABEL = f"{API_GROUP}/framework"
#: Kueue's labels on a job: the LocalQueue it is submitted to, and its WorkloadPriorityClass (the local queue reads
#: both, so one manifest means the same on either backend).
KUEUE_QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"

# --- trainjob's own annotations ---------------------------------------------------------------------------------
ANNOTATION_PREFIX = "trainjob/"
#: The launch values (nodes, processes per node, port, elastic range) the job was resolved to, as JSON.
LAUNCH_ANNOTATION = f"{ANNOTATION_PREFIX}launch"
TTL_ANNOTATION = f"{ANNOTATION_PREFIX}ttl-seconds-after-finished"
PRIORITY_ANNOTATION = f"{ANNOTATION_PREFIX}priority"
OVERSUBSCRIBE_ANNOTATION = f"{ANNOTATION_PREFIX}oversubscribe"
STRICT_RESOURCES_ANNOTATION = f"{ANNOTATION_PREFIX}strict-resources"
NCCL_PROFILE_ANNOTATION = f"{ANNOTATION_PREFIX}nccl-profile"
#: The time of the newest resize the operator has reported as an event (RFC 3339, from the pod log).
RESIZE_ANNOTATION = f"{ANNOTATION_PREFIX}last-resize"
#: The claim a Kubernetes job gets for ``/workspace`` when its initializers and trainer share nothing there
#: (:mod:`trainjob.backends.kubernetes.workspace`): its size, storage class and access mode.
WORKSPACE_SIZE_ANNOTATION = f"{ANNOTATION_PREFIX}workspace-size"
WORKSPACE_STORAGE_CLASS_ANNOTATION = f"{ANNOTATION_PREFIX}workspace-storage-class"
WORKSPACE_ACCESS_MODE_ANNOTATION = f"{ANNOTATION_PREFIX}workspace-access-mode"
CONVERTED_FROM_ANNOTATION = f"{ANNOTATION_PREFIX}converted-from"
CONVERSION_WARNINGS_ANNOTATION = f"{ANNOTATION_PREFIX}conversion-warnings"
#: The stall watch (:mod:`trainjob.backends.stall`): how long without progress is a stall, and what follows it.
STALL_TIMEOUT_ANNOTATION = f"{ANNOTATION_PREFIX}stall-timeout"
#: Restarts of a job's node group on the cluster, kept on the TrainJob by the operator: the JobSet's restarts it has
#: reported as events (they count against ``maxRestarts``), those it made for a stall, and those after a disruption
#: (a pod evicted, preempted or lost: not counted).
RESTARTS_REPORTED_ANNOTATION = f"{ANNOTATION_PREFIX}restarts-reported"
STALL_RESTARTS_ANNOTATION = f"{ANNOTATION_PREFIX}stall-restarts"
DISRUPTIONS_ANNOTATION = f"{ANNOTATION_PREFIX}disruptions"
STALL_ACTION_ANNOTATION = f"{ANNOTATION_PREFIX}stall-action"
#: The stall watch's derived limit: this many times the longest interval between two reports, at least the floor.
STALL_INTERVAL_FACTOR = 10.0
STALL_FLOOR_SECONDS = 60.0
#: In a Kubernetes job's pods: when a rank that stops reporting dumps its own stacks to its log
#: (:mod:`trainjob.torch.rank_stacks`): ``auto`` (also where it is absent and the next one is set), seconds, or
#: ``off``.
STALL_DUMP_ENV = "TRAINJOB_STALL_DUMP"
#: In a Kubernetes job's pods: where their ranks report their collectives (:mod:`trainjob.pod_site`), a URL reference
#: resolved against ``KUBEFLOW_TRAINER_SERVER_URL`` (RFC 3986; the operator sets the relative ``collectives``).
COLLECTIVES_URL_ENV = "TRAINJOB_COLLECTIVES_URL"
#: ``trainjob stacks NAME`` on Kubernetes: the pod annotation it sets to a new value to ask the pod's ranks for
#: their stacks, and the file of the pods' status-client volume the kubelet writes it into (a downward-API item).
STACKS_REQUEST_ANNOTATION = "trainjob/stacks-request"
STACKS_REQUEST_FILE = "stacks-request"

# --- torchrun's environment (torchrun reads PET_<OPTION> as --<option>) -----------------------------------------
PET_PREFIX = "PET_"
PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
PET_RDZV_ID = "PET_RDZV_ID"
PET_RDZV_CONF = "PET_RDZV_CONF"
#: Set to ``1`` for elastic jobs: each rendezvous round's ranks get a store of their own. The one torchrun shares
#: by default outlives its round, and the ranks of a smaller round would read what the last round's left in it.
TORCH_DISABLE_SHARE_RDZV_TCP_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

# --- torchtune, Kubeflow's BuiltinTrainer (:mod:`trainjob.runtime.plugins.torchtune`) ------------------------------
#: The ``trainer.kubeflow.org/framework`` label value of the LLM fine-tuning runtimes.
TORCHTUNE_FRAMEWORK = "torchtune"
#: A trainer command equal to this is the BuiltinTrainer's: the torch plugin completes it with recipe and config.
TORCHTUNE_ENTRYPOINT = ("tune", "run")
TORCHTUNE_ARG_RDZV_ENDPOINT = "--rdzv_endpoint"
TORCHTUNE_ARG_CONFIG = "--config"
TORCHTUNE_INSTRUCT_DATASET = "torchtune.datasets.instruct_dataset"
#: Recipes and the config suffixes that pick the model's config (``llama3_2/1B`` + ``_lora`` -> ``llama3_2/1B_lora``).
TORCHTUNE_FULL_FINETUNE_SINGLE_DEVICE = "full_finetune_single_device"
TORCHTUNE_FULL_FINETUNE_DISTRIBUTED = "full_finetune_distributed"
TORCHTUNE_LORA_FINETUNE_SINGLE_DEVICE = "lora_finetune_single_device"
TORCHTUNE_LORA_FINETUNE_DISTRIBUTED = "lora_finetune_distributed"
TORCHTUNE_FULL_SINGLE_DEVICE_SUFFIX = "_full_single_device"
TORCHTUNE_FULL_MULTI_DEVICES_SUFFIX = "_full"
TORCHTUNE_FULL_MULTI_NODES_SUFFIX = "_full_multinode"
TORCHTUNE_LORA_SINGLE_DEVICE_SUFFIX = "_lora_single_device"
TORCHTUNE_QLORA_SINGLE_DEVICE_SUFFIX = "_qlora_single_device"
TORCHTUNE_LORA_DISTRIBUTED_SUFFIX = "_lora"
TORCHTUNE_QLORA_DISTRIBUTED_SUFFIX = "_qlora"
#: The config items in ``spec.trainer.args`` that switch LoRA, QLoRA and DoRA on.
TORCHTUNE_LORA_ATTN_MODULES = "model.lora_attn_modules"
TORCHTUNE_QUANTIZE_BASE = "model.quantize_base"
TORCHTUNE_USE_DORA = "model.use_dora"
#: The models of the torchtune runtimes (``torchtune-llama3.2-1b`` -> ``llama3_2/1B``).
TORCHTUNE_MODEL_LLAMA3_2_1B = "llama3_2/1B"
TORCHTUNE_MODEL_LLAMA3_2_3B = "llama3_2/3B"
TORCHTUNE_MODEL_LLAMA3_3_70B = "llama3_3/70B"
TORCHTUNE_MODEL_QWEN2_5_1_5B = "qwen2_5/1.5B"
TORCHTUNE_SUPPORTED_MODELS = frozenset(
    {TORCHTUNE_MODEL_LLAMA3_2_1B, TORCHTUNE_MODEL_LLAMA3_2_3B, TORCHTUNE_MODEL_LLAMA3_3_70B, TORCHTUNE_MODEL_QWEN2_5_1_5B}
)
#: Config items the runtime's command sets (where the initializers put model and output) and a job may not.
TORCHTUNE_IMMUTABLE_CONFIGS = frozenset(
    {"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file"}
)

# --- job statuses (the TrainJob's condition types, and the SDK's steps) -----------------------------------------
QUEUED = "Queued"
CREATED = "Created"
RUNNING = "Running"
COMPLETE = "Complete"
FAILED = "Failed"
SUSPENDED = "Suspended"
#: The TrainJob condition of a job whose pods the scheduler cannot place (the operator's; Kubeflow's has none).
UNSCHEDULABLE = "Unschedulable"
JOB_STATUSES = (QUEUED, CREATED, RUNNING, COMPLETE, FAILED, SUSPENDED)
FINISHED_STATUSES = (COMPLETE, FAILED)

# --- trainjob's own environment in training processes -----------------------------------------------------------
#: The JSON-lines file ``trainjob.torch.report`` appends metrics to (set by the local backend).
METRICS_FILE_ENV = "TRAINJOB_METRICS_FILE"
#: A local job's directory: every process of the job has it (the local backend's process sweeps look for it).
JOB_DIR_ENV = "TRAINJOB_JOB_DIR"
#: What each node of a Ray job offers Ray (``ray start --num-cpus/--num-gpus``), set by the Ray runtime plugin from
#: ``resourcesPerNode``; without them Ray counts the machine's.
RAY_NUM_CPUS_ENV = "TRAINJOB_RAY_NUM_CPUS"
RAY_NUM_GPUS_ENV = "TRAINJOB_RAY_NUM_GPUS"

# --- the operator's status endpoint, as its jobs' pods reach it ----------------------------------------------------
#: The ConfigMap with the endpoint's CA (``ca.crt``) that the operator keeps in each namespace it makes pods in.
STATUS_CA_CONFIGMAP = "trainjob-status-ca"
