"""Input pipelines: tfds array_record builders, grain pipelines, MLM masking, packing.

Importing this package is cheap; import submodules (`builders`, `pipeline`, ...)
where needed. Nothing here imports the model.
"""
