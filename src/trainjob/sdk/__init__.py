"""The Python SDK, with the Kubeflow SDK's names: :class:`~trainjob.sdk.client.TrainerClient` and its types.

=====================================  ==========================================================================
:mod:`~trainjob.sdk.client`            ``TrainerClient`` and the backend configurations; the only module here that
                                       picks a backend
:mod:`~trainjob.sdk.types`             the value types (``CustomTrainer``, ``TrainJob``, ``Step``, ``LogLine`` ...)
:mod:`~trainjob.sdk.options`           ``train(options=[...])``: ``Name``, ``Labels``, patches
:mod:`~trainjob.sdk.initializers`      ``train(initializer=Initializer(...))``: Kubeflow's dataset and model types
:mod:`~trainjob.sdk.trainers`          a trainer plus its options as a TrainJob, the same for every backend
:mod:`~trainjob.sdk.trainer_checks`    what a ``CustomTrainer``'s function and packages must satisfy
:mod:`~trainjob.sdk.function_script`   a ``CustomTrainer``'s function as the program every rank runs
=====================================  ==========================================================================

Backends speak the SDK's types, so every module but :mod:`~trainjob.sdk.client` sits below them and imports no
backend. Import the names from :mod:`trainjob` (``from trainjob import TrainerClient, CustomTrainer``).
"""
