# runcell's session interpreter for Ruby: runs a session's cells one after another in one
# top-level binding, like irb: local variables, methods, classes and constants persist from
# cell to cell. `exit n` ends the cell, not the session, with exit code n. SIGINT (a timeout)
# raises Interrupt in the running cell. A call's own environment variables are in
# /tmp/.runcell-env (NAME=value entries, each ended by NUL): set for that cell, then undone.
# The cell's final value (unless nil) is reported as its main result (`text/plain`, inspect),
# and an uncaught exception as its exception, in /tmp/.runcell-results.json, which the host
# reads after the cell (docs/results.md).
#
# Channel (fd 4, a unix socket to the sandbox's pid 1): "R\n" when ready; pid 1 sends
# "K <source path>\n" with the cell's stdin attached as a descriptor; this process answers
# "D <exit code>\n" when the cell is over.
require 'json'
require 'socket'

module RuncellRunner
  def self.main
    chan = UNIXSocket.for_fd(4)
    chan.close_on_exec = true
    $stdout.sync = true
    $stderr.sync = true
    count = 0
    chan.write("R\n")
    loop do
      trap('INT', 'IGNORE')
      msg, _addr, _flags, *controls = chan.recvmsg(4096, 0, nil, scm_rights: true)
      exit!(0) if msg.nil? || msg.empty?
      exit!(125) unless msg.start_with?('K ') && msg.end_with?("\n")
      io = controls.first&.unix_rights&.first
      exit!(125) if io.nil?
      STDIN.reopen(io)
      io.close
      $stdin = STDIN
      count += 1
      unlink_quietly(RESULTS_PATH)
      restore = apply_env(take_env)
      report = { 'results' => [], 'exception' => nil }
      code = run_cell(msg[2..-2], count, report)
      restore.reverse_each { |name, old| ENV[name] = old }
      write_results(report)
      trap('INT', 'IGNORE')
      $stdout.flush
      $stderr.flush
      chan.write("D #{code & 0xFF}\n")
    end
  end

  def self.run_cell(path, count, shown)
    source = File.read(path)
    File.unlink(path)
    trap('INT', 'DEFAULT')
    value = eval(source, TOPLEVEL_BINDING, "<cell #{count}>", 1)
    trap('INT', 'IGNORE')
    unless value.nil?
      text = begin
        value.inspect.to_s
      rescue Exception # rubocop:disable Lint/RescueException
        "#<#{value.class}>"
      end
      shown['results'] << { 'is_main_result' => true, 'data' => { 'text/plain' => text } }
    end
    0
  rescue SystemExit => e
    e.status
  rescue Interrupt => e
    shown['exception'] = report(e)
    130
  rescue Exception => e # rubocop:disable Lint/RescueException
    shown['exception'] = report(e)
    1
  end

  RESULTS_PATH = '/tmp/.runcell-results.json'
  # The most bytes of results a cell reports (the host's cap is the same): past it, results
  # are left out and counted.
  RESULTS_MAX_BYTES = 8 << 20

  def self.unlink_quietly(path)
    File.unlink(path)
  rescue SystemCallError
    nil
  end

  # The cell's report, written whole under a temporary name first.
  def self.write_results(shown)
    data = JSON.generate(shown)
    if data.bytesize > RESULTS_MAX_BYTES
      data = JSON.generate({ 'results' => [], 'exception' => shown['exception'], 'dropped' => 1 })
    end
    tmp = "#{RESULTS_PATH}.tmp"
    unlink_quietly(tmp)
    File.open(tmp, File::WRONLY | File::CREAT | File::EXCL | File::NOFOLLOW, 0o600) { |f| f.write(data) }
    File.rename(tmp, RESULTS_PATH)
  rescue StandardError => e
    $stderr.puts("runcell: the cell's results could not be reported: #{e.class}: #{e.message}")
  end

  ENV_PATH = '/tmp/.runcell-env'

  # The call's own variables, if any (the file is removed).
  def self.take_env
    data = File.open(ENV_PATH, File::RDONLY | File::NOFOLLOW | File::NONBLOCK) { |f| f.read(1 << 20) }
    File.unlink(ENV_PATH)
    (data || '').split("\0").filter_map do |entry|
      name, sep, value = entry.partition('=')
      [name, value] unless sep.empty? || name.empty?
    end
  rescue SystemCallError
    []
  end

  # Set them; what to put back after the call.
  def self.apply_env(pairs)
    pairs.map do |name, value|
      old = ENV[name]
      ENV[name] = value
      [name, old]
    end
  rescue ArgumentError
    []
  end

  # Print `e` as an uncaught exception, without this runner's frames; its report (name, value,
  # the traceback as printed).
  def self.report(e)
    if e.backtrace
      e.set_backtrace(e.backtrace.reject { |l| l.start_with?('-e:') })
    end
    text = e.full_message(highlight: false)
    $stderr.print(text)
    { 'name' => e.class.name.to_s, 'value' => e.message.to_s, 'traceback' => text }
  rescue Exception # rubocop:disable Lint/RescueException
    $stderr.puts("#{e.class}: #{e.message}")
    { 'name' => e.class.name.to_s, 'value' => '', 'traceback' => '' }
  end
end

RuncellRunner.main
