# shellcheck shell=bash
# Sourced by launch/local.sh, tpu_pod.sh and slurm.sbatch: printing commands (the dry-run switch) and the
# project's install step.

# Words as one shell line, each quoted only where it needs to be (as Python's shlex.quote), so the line can be
# pasted into a shell or parsed back with shlex.split.
words() {
  local sep="" word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      printf '%s%s' "$sep" "$word"
    else
      printf "%s'%s'" "$sep" "${word//\'/\'\\\'\'}"
    fi
    sep=" "
  done
}

# Prints a command as `+ argv...` and runs it, unless DRY_RUN is set: then nothing runs.
run() {
  printf '+ %s\n' "$(words "$@")"
  if [ -z "${DRY_RUN:-}" ]; then
    "$@"
  fi
}

# The project's install step as one shell line for the checkout at $1: `make install` (a .venv with jaxpos, the
# Makefile's first step; PYTHON picks the interpreter, >= 3.11), then the accelerator build of jax named by $2 (cuda12,
# cuda13, tpu; empty keeps the CPU build).
install_line() {
  local line
  line="cd $(words "$1") && make install PYTHON=$(words "${PYTHON:-python3}")"
  if [ -n "$2" ]; then
    line+=" && .venv/bin/python -m pip install -q -U $(words "jax[$2]")"
  fi
  printf '%s\n' "$line"
}
