"""lumos's engine: the processes of a cluster and the pieces they share.

Nothing here is public (it may change any day): ``lumos``'s API modules, ``lumos.state``
and ``lumos.util`` re-export what users and the front ends may use. ``README.md`` beside
this file maps the packages, the processes and the path of a task through the files.

May import: the standard library, third-party packages, and ``lumos.exceptions`` /
``lumos.object_ref`` / ``lumos.generator`` (the public value types the core worker
makes). Never ``lumos.kernelext`` or ``lumos.dashboard``.
"""
