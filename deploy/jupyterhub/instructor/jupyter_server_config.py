"""Instructors' servers only (the hub points them at this folder).

The formgrader is a page of the instructor's own server shown in a frame of JupyterLab. JupyterHub
forbids every frame by default (Content-Security-Policy "frame-ancestors 'none'": a blank panel,
"127.0.0.1 refused to connect"); nbgrader's documented setting lets the server frame its own pages.
Set here, it applies to instructors' servers alone, not to students'.
"""

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

c.ServerApp.tornado_settings = {"headers": {"Content-Security-Policy": "frame-ancestors 'self'"}}
