//! The few functions of CPython's C API a template needs, from the runtime's own
//! `libpython3.X.so`, loaded with `dlopen` at run time: runcell links no Python, and a host
//! without the shared library simply has no templates.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

use super::TemplateError;

type DecodeLocale = unsafe extern "C" fn(*const c_char, *mut usize) -> *mut c_void;
type SetProgramName = unsafe extern "C" fn(*const c_void);
type InitializeEx = unsafe extern "C" fn(c_int);
type RunSimpleString = unsafe extern "C" fn(*const c_char) -> c_int;
type Hook = unsafe extern "C" fn();

/// The loaded library's entry points.
pub(super) struct Python {
    decode_locale: DecodeLocale,
    set_program_name: SetProgramName,
    initialize_ex: InitializeEx,
    run_simple_string: RunSimpleString,
    before_fork: Hook,
    after_fork_parent: Hook,
    after_fork_child: Hook,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a pointer to a NUL-terminated string owned by libc, valid
    // until the next dl* call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown dlopen error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Python {
    /// Load `library` (RTLD_GLOBAL, so that extension modules imported later resolve the
    /// C API against it) and look up the functions.
    pub(super) fn load(library: &Path) -> Result<Python, TemplateError> {
        let path = CString::new(library.as_os_str().as_encoded_bytes())
            .map_err(|_| TemplateError::Python("library path with a NUL byte".into()))?;
        // SAFETY: dlopen with a valid C string; the library's initialisers run here, in the
        // single-threaded template before anything else.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(TemplateError::Python(format!(
                "dlopen {}: {}",
                library.display(),
                dl_error()
            )));
        }
        let sym = |name: &CStr| -> Result<*mut c_void, TemplateError> {
            // SAFETY: a valid handle from dlopen above and a NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                return Err(TemplateError::Python(format!(
                    "{} has no {}",
                    library.display(),
                    name.to_string_lossy()
                )));
            }
            Ok(p)
        };
        // SAFETY: each symbol is the C API function of that name, whose signature (stable ABI
        // since CPython 3.7) is the one it is transmuted to; the library stays loaded for the
        // life of the process (it is never dlclosed).
        unsafe {
            Ok(Python {
                decode_locale: std::mem::transmute::<*mut c_void, DecodeLocale>(sym(
                    c"Py_DecodeLocale",
                )?),
                set_program_name: std::mem::transmute::<*mut c_void, SetProgramName>(sym(
                    c"Py_SetProgramName",
                )?),
                initialize_ex: std::mem::transmute::<*mut c_void, InitializeEx>(sym(
                    c"Py_InitializeEx",
                )?),
                run_simple_string: std::mem::transmute::<*mut c_void, RunSimpleString>(sym(
                    c"PyRun_SimpleString",
                )?),
                before_fork: std::mem::transmute::<*mut c_void, Hook>(sym(c"PyOS_BeforeFork")?),
                after_fork_parent: std::mem::transmute::<*mut c_void, Hook>(sym(
                    c"PyOS_AfterFork_Parent",
                )?),
                after_fork_child: std::mem::transmute::<*mut c_void, Hook>(sym(
                    c"PyOS_AfterFork_Child",
                )?),
            })
        }
    }

    /// Start the interpreter as `program` would start (its `sys.executable`, prefix and
    /// site-packages: a virtual environment's python finds its `pyvenv.cfg`), with Python's
    /// usual signal handling (SIGINT as KeyboardInterrupt, SIGPIPE ignored), reading its
    /// configuration from the environment as `python3` does.
    pub(super) fn initialize(&self, program: &Path) -> Result<(), TemplateError> {
        let name = CString::new(program.as_os_str().as_encoded_bytes())
            .map_err(|_| TemplateError::Python("program path with a NUL byte".into()))?;
        // SAFETY: Py_DecodeLocale reads a C string and returns a PyMem_RawMalloc'd wide string
        // (or NULL), which Py_SetProgramName requires to stay valid for the life of the
        // process: it is never freed. Py_InitializeEx is then called once, from the only
        // thread.
        unsafe {
            let wide = (self.decode_locale)(name.as_ptr(), std::ptr::null_mut());
            if wide.is_null() {
                return Err(TemplateError::Python(
                    "cannot decode the program path".into(),
                ));
            }
            (self.set_program_name)(wide);
            (self.initialize_ex)(1);
        }
        Ok(())
    }

    /// Run `code` in `__main__`; false if it raised (the traceback went to stderr).
    pub(super) fn run(&self, code: &str) -> bool {
        let Ok(code) = CString::new(code) else {
            return false;
        };
        // SAFETY: the interpreter is initialised and this is its only thread holding the GIL
        // (the main thread, which initialised it); `code` is a valid C string.
        unsafe { (self.run_simple_string)(code.as_ptr()) == 0 }
    }

    /// Call before `fork`: takes the interpreter's locks and runs `os.register_at_fork`'s
    /// `before` hooks.
    pub(super) fn before_fork(&self) {
        // SAFETY: called from the thread that holds the GIL, right before fork.
        unsafe { (self.before_fork)() }
    }

    /// Call in the parent after `fork` (or after a failed fork).
    pub(super) fn after_fork_parent(&self) {
        // SAFETY: called in the parent right after fork, paired with before_fork.
        unsafe { (self.after_fork_parent)() }
    }

    /// Call in the child after `fork`: resets the interpreter's locks and threads and runs
    /// the `after_in_child` hooks (the `random` module reseeds itself there).
    pub(super) fn after_fork_child(&self) {
        // SAFETY: called in the child right after fork, paired with before_fork.
        unsafe { (self.after_fork_child)() }
    }
}
