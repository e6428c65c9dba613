# Every exception a running Python process formats (CPython's PyErr_Format), by its message's
# format: an exception raised and caught inside C still formats its message, a few
# microseconds each (docs/architecture.md, "Development"). Under load, for 20 s:
#   timeout -s INT 20 gdb -p PID -batch -x bench/exceptions.gdb | grep '^raised' | sort | uniq -c
set pagination off
break PyErr_Format
commands
silent
printf "raised: %s\n", (char*)$rsi
continue
end
continue
