"""What a run leaves behind to be read: its metrics, in files and in the trackers.

    metrics_file.py   metrics.jsonl, the plain record of every logged metric
    tracker.py        MLflow from rank 0 (a local sqlite store or a server), with the dashboards
    run_record.py     what an MLflow run records about itself: source, commit, tags, data, params
    end_run.py        the end of a launch whose ranks were killed (the launch's, after a second Ctrl-C)
    dashboards.py     TensorBoard and Weights & Biases, as a config asks for them
"""
