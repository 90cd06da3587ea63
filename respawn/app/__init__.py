"""The application: what a user runs on their own machine with their own credentials (the `respawn` command), its
report, plan and timeline, and the CLI's adapters (jobstore, codestore, compute_read and the looks `jobs register`
takes). It builds on the kernel (respawn.*) and the control plane's pure core; neither imports it (pyproject.toml's
import contracts)."""
