# runcell's session interpreter for bash: runs a session's cells one after another in one
# shell, as if typed into it: the working directory, shell and exported variables, functions
# and aliases persist from cell to cell. A cell's exit code is that of its last command;
# `exit` ends the shell (the session restarts it, and says its state was lost). SIGINT (a
# timeout) interrupts the running cell.
#
# Channel (fd 4, a unix socket to the sandbox's pid 1): "R\n" when ready; pid 1 sends
# "K <source path>\n"; this shell answers "D <exit code>\n" when the cell is over. The cell's
# stdin is the file /tmp/.runcell-stdin when the cell has one.
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
  trap 'return 130' INT
  source "$__runcell_src" <&5 4>&- 5<&-
  __runcell_rc=$?
  trap '' INT
  exec 5<&-
  rm -f "$__runcell_src"
  printf 'D %d\n' "$__runcell_rc" >&4
done
exit 0
