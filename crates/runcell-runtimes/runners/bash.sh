# runcell's session interpreter for bash: runs a session's cells one after another in one
# shell, as if typed into it: the working directory, shell and exported variables, functions
# and aliases persist from cell to cell. A cell's exit code is that of its last command;
# `exit` ends the shell (the session restarts it, and says its state was lost). SIGINT (a
# timeout) interrupts the running cell.
#
# Channel (fd 4, a unix socket to the sandbox's pid 1): "R\n" when ready; pid 1 sends
# "K <source path>\n"; this shell answers "D <exit code>\n" when the cell is over. The cell's
# stdin is the file /tmp/.runcell-stdin when the cell has one; its own environment variables
# are in /tmp/.runcell-env (NAME=value entries, each ended by NUL), exported for this cell and
# put back as they were after it.
shopt -s expand_aliases
trap '' INT
printf 'R\n' >&4
while IFS= read -r __runcell_line <&4; do
  case $__runcell_line in
    "K "*) ;;
    *) exit 125 ;;
  esac
  __runcell_src=${__runcell_line#K }
  if [ -f /tmp/.runcell-stdin ]; then
    exec 5</tmp/.runcell-stdin
    rm -f /tmp/.runcell-stdin
  else
    exec 5</dev/null
  fi
  __runcell_restore=()
  __runcell_unset=()
  if [ -f /tmp/.runcell-env ] && [ ! -L /tmp/.runcell-env ]; then
    while IFS= read -r -d '' __runcell_kv; do
      __runcell_name=${__runcell_kv%%=*}
      # Only a name (the host checked it; the file is in the cell's reach), never an
      # expression `${!name}` would evaluate.
      [[ $__runcell_name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
      if [ -n "${!__runcell_name+x}" ]; then
        __runcell_restore+=("$__runcell_name=${!__runcell_name}")
      else
        __runcell_unset+=("$__runcell_name")
      fi
      export "$__runcell_kv"
    done </tmp/.runcell-env
  fi
  rm -f /tmp/.runcell-env
  trap 'return 130' INT
  source "$__runcell_src" <&5 4>&- 5<&-
  __runcell_rc=$?
  trap '' INT
  for __runcell_kv in "${__runcell_restore[@]}"; do
    export "$__runcell_kv"
  done
  for __runcell_name in "${__runcell_unset[@]}"; do
    unset "$__runcell_name"
  done
  exec 5<&-
  rm -f "$__runcell_src"
  printf 'D %d\n' "$__runcell_rc" >&4
done
exit 0
