"""What the user reads: inspection, traces, tables and plots."""
