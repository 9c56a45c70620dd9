@echo off
rem ==========================================================================
rem  Wan video studio launcher for Windows. Double-click it, or run it in a
rem  console:
rem    launch.bat [app args...]          set up .venv when needed, run app.py
rem    launch.bat test [pytest args...]  the same plus the test packages and
rem                                      a browser for the page tests (Chrome
rem                                      or Edge, else Playwright's download),
rem                                      then run the test suite
rem
rem  The first run creates .venv next to this file, installs torch (the build
rem  that fits this PC) and requirements.txt. Later runs find a matching stamp
rem  file in .venv and skip pip entirely, so they start in seconds.
rem
rem  Environment variables:
rem    PYTHON              python.exe used to create .venv, 3.10 or newer
rem    WAN_TORCH_SPEC      pip arguments for torch instead of the automatic
rem                        choice, e.g. "torch==2.13.0"; used when .venv has
rem                        no torch yet (delete .venv to start over)
rem    WAN_ROCM_ARCH       force AMD's ROCm wheels for this GPU family, e.g.
rem                        gfx1151, gfx110X-all or gfx120X-all
rem    WAN_SKIP_INSTALL=1  never run pip; use .venv as it is
rem    WAN_NO_PAUSE=1      do not wait for a key press after an error
rem    WAN_TEST_BROWSER    the Chrome, Edge or Chromium the page tests drive
rem    WAN_TEST_PROMETHEUS the prometheus.exe the monitoring tests start
rem ==========================================================================
setlocal EnableExtensions DisableDelayedExpansion
rem pushd, unlike cd, also copes with a \\server\share folder.
pushd "%~dp0"
if not exist "%~nx0" (
    echo [setup] ERROR: cannot enter the folder of launch.bat
    if not defined WAN_NO_PAUSE pause
    exit /b 1
)
if not defined PYTHONUTF8 set "PYTHONUTF8=1"

rem ---- arguments: "test" selects the test mode; the rest go to pytest ------
rem The raw argument text is cut, not shifted, so that "=" and "," survive.
set "MODE=run"
set "TEST_ARGS="
if /i not "%~1"=="test" goto :args_done
set "MODE=test"
set "ALL_ARGS=%*"
set "TEST_ARGS=%ALL_ARGS:~4%"
:args_done

setlocal EnableDelayedExpansion
set "VPY=.venv\Scripts\python.exe"
set "STAMP=.venv\wan-install-stamp.txt"
set "TEST_STAMP=.venv\wan-test-stamp.txt"
set "TORCH_DEFAULT=torch==2.13.0"
set "VENV_CLEAR="

rem ---- virtual environment ------------------------------------------------
if not exist "%VPY%" goto :make_venv
"%VPY%" -c "import sys" >nul 2>&1
if not errorlevel 1 goto :venv_ok
echo [setup] the existing .venv does not work - its Python may be gone: re-creating it
set "VENV_CLEAR=--clear"
:make_venv
call :find_python
if errorlevel 1 goto :fail
echo [setup] creating virtual environment .venv with !PYCMD!
call %PYCMD% -m venv %VENV_CLEAR% .venv
if errorlevel 1 (
    echo [setup] ERROR: could not create .venv with !PYCMD!
    goto :fail
)
if exist "%STAMP%" del /q "%STAMP%"
if exist "%TEST_STAMP%" del /q "%TEST_STAMP%"
:venv_ok

rem ---- packages: only when requirements or the torch choice changed -------
if "%WAN_SKIP_INSTALL%"=="1" (
    echo [setup] WAN_SKIP_INSTALL=1: skipping all pip work
    goto :installed
)
if not exist requirements.txt (
    echo [setup] ERROR: requirements.txt is missing
    goto :fail
)
if "%MODE%"=="test" if not exist requirements-test.txt (
    echo [setup] ERROR: requirements-test.txt is missing
    goto :fail
)
rem The stamp key: a SHA-256 of the requirement files plus the torch choice.
"%VPY%" -c "import hashlib, os, sys; h = hashlib.sha256(); [h.update(n.encode() + b'\0' + open(n, 'rb').read()) for n in sys.argv[1:]]; print('requirements=' + h.hexdigest() + ' torch=' + (os.environ.get('WAN_TORCH_SPEC', '').strip() or 'auto'))" requirements.txt requirements-nodeps.txt > .venv\wan-key.txt
if errorlevel 1 goto :fail
set "NEED_INSTALL="
call :key_differs .venv\wan-key.txt "%STAMP%"
if not "%MODE%"=="test" goto :key_done
"%VPY%" -c "import hashlib, os, sys; h = hashlib.sha256(); [h.update(n.encode() + b'\0' + open(n, 'rb').read()) for n in sys.argv[1:]]; print('requirements=' + h.hexdigest() + ' torch=' + (os.environ.get('WAN_TORCH_SPEC', '').strip() or 'auto'))" requirements.txt requirements-nodeps.txt requirements-test.txt > .venv\wan-key-test.txt
if errorlevel 1 goto :fail
call :key_differs .venv\wan-key-test.txt "%TEST_STAMP%"
:key_done
if not defined NEED_INSTALL goto :installed

if exist "%STAMP%" (
    echo [setup] requirements, test packages or torch choice changed: updating .venv
) else (
    echo [setup] first setup: installing packages into .venv - this takes a few minutes
)
call :install_torch
if errorlevel 1 goto :fail
if "%MODE%"=="test" (
    echo [setup] pip install -r requirements.txt -r requirements-test.txt
    "%VPY%" -m pip install --disable-pip-version-check -r requirements.txt -r requirements-test.txt
) else (
    echo [setup] pip install -r requirements.txt
    "%VPY%" -m pip install --disable-pip-version-check -r requirements.txt
)
if errorlevel 1 (
    echo [setup] ERROR: pip install failed
    goto :fail
)
echo [setup] pip install --no-deps -r requirements-nodeps.txt
"%VPY%" -m pip install --disable-pip-version-check --no-deps -r requirements-nodeps.txt
if errorlevel 1 (
    echo [setup] ERROR: pip install failed
    goto :fail
)
"%VPY%" -c "import torch; dev = ('GPU: ' + torch.cuda.get_device_name(0)) if torch.cuda.is_available() else 'no GPU visible: CPU only'; print('[setup] torch', torch.__version__, '-', dev)"
if errorlevel 1 (
    echo [setup] ERROR: torch is installed but does not import
    goto :fail
)
copy /y .venv\wan-key.txt "%STAMP%" >nul
if "%MODE%"=="test" copy /y .venv\wan-key-test.txt "%TEST_STAMP%" >nul
echo [setup] packages installed
:installed

rem ---- run ------------------------------------------------------------------
if "%MODE%"=="test" goto :run_tests
if not exist app.py (
    echo [setup] ERROR: app.py is missing
    goto :fail
)
rem Delayed expansion off, so that exclamation marks in the arguments reach
rem app.py intact.
setlocal DisableDelayedExpansion
"%VPY%" app.py %*
set "APP_RC=%ERRORLEVEL%"
if "%APP_RC%"=="0" exit /b 0
rem Ctrl+C is the normal way to stop the server: no pause for it.
if "%APP_RC%"=="-1073741510" exit /b 0
echo.
echo [app] app.py stopped with exit code %APP_RC%. Read the messages above.
call :maybe_pause
exit /b %APP_RC%

:run_tests
if not exist "tests\" (
    echo [setup] ERROR: there is no tests folder
    goto :fail
)
rem The page tests drive a real browser: Chrome or Edge when installed, else
rem Playwright's own Chromium, downloaded once (the line printed says which).
set "WAN_BROWSER_FILE=.venv\wan-test-browser.txt"
"%VPY%" -m tests.browser_setup > "%WAN_BROWSER_FILE%"
if errorlevel 1 (
    echo [test] ERROR: no browser for the page tests - see the message above
    goto :fail
)
set /p WAN_TEST_BROWSER=<"%WAN_BROWSER_FILE%"
rem The monitoring tests scrape the app with a real Prometheus: one on this
rem machine, else its own release, downloaded once (the line printed says which).
set "WAN_PROMETHEUS_FILE=.venv\wan-test-prometheus.txt"
"%VPY%" -m tests.prometheus_setup > "%WAN_PROMETHEUS_FILE%"
if errorlevel 1 (
    echo [test] ERROR: no Prometheus for the monitoring tests - see the message above
    goto :fail
)
set /p WAN_TEST_PROMETHEUS=<"%WAN_PROMETHEUS_FILE%"
setlocal DisableDelayedExpansion
rem pytest.ini names tests\ as the default; paths given here run alone.
"%VPY%" -m tests.run %TEST_ARGS%
set "TEST_RC=%ERRORLEVEL%"
if "%TEST_RC%"=="5" echo [test] pytest collected no tests - exit code 5 - that counts as a failure
exit /b %TEST_RC%

rem ==========================================================================
rem  Subroutines
rem ==========================================================================

:fail
echo [setup] setup did not finish - see the messages above.
call :maybe_pause
exit /b 1

:maybe_pause
if defined WAN_NO_PAUSE exit /b 0
if defined CI exit /b 0
pause
exit /b 0

rem Sets NEED_INSTALL=1 when a one-line key file (first argument) differs
rem from the stamp file (second argument).
:key_differs
set "KEY_WANT="
set "KEY_HAVE="
set /p KEY_WANT=<"%~1"
if exist "%~2" set /p KEY_HAVE=<"%~2"
if not defined KEY_WANT set "NEED_INSTALL=1"
if not "!KEY_WANT!"=="!KEY_HAVE!" set "NEED_INSTALL=1"
exit /b 0

rem Sets PYCMD to a Python 3.10+ command: PYTHON, else py -3.12, py -3.11, ...
rem "call" also copes with python.bat shims such as pyenv-win's.
:find_python
set "PYCMD="
if not defined PYTHON goto :find_python_auto
set "PYTHON=%PYTHON:"=%"
call "%PYTHON%" -c "import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)" >nul 2>&1
if errorlevel 1 (
    echo [setup] ERROR: PYTHON=!PYTHON! is not a working Python 3.10 or newer
    exit /b 1
)
set PYCMD="%PYTHON%"
exit /b 0
:find_python_auto
for %%C in ("py -3.12" "py -3.11" "py -3.13" "py -3.10" "python") do (
    if not defined PYCMD (
        call %%~C -c "import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)" >nul 2>&1
        if not errorlevel 1 set "PYCMD=%%~C"
    )
)
if defined PYCMD exit /b 0
echo [setup] ERROR: no Python 3.10 or newer found.
echo [setup] Install Python 3.12 for Windows, tick "Add python.exe to PATH" in its
echo [setup] installer, then run launch.bat again. Or set PYTHON to the full path
echo [setup] of python.exe.
exit /b 1

rem Installs torch unless it is already there: an installed torch is always
rem kept (delete .venv to start over). Else WAN_TORCH_SPEC, else detection.
:install_torch
set "TORCH_SPEC="
set "TORCH_WHY="
set "TV="
for /f "delims=" %%V in ('%VPY% -c "import torch; print(torch.__version__)" 2^>nul') do set "TV=%%V"
if defined TV (
    echo [setup] torch !TV! is already installed in .venv: keeping it
    if defined WAN_TORCH_SPEC echo [setup]   WAN_TORCH_SPEC is not used while torch is installed: delete .venv to start over with it
    exit /b 0
)
if defined WAN_TORCH_SPEC (
    set "TORCH_SPEC=!WAN_TORCH_SPEC!"
    set "TORCH_WHY=set by WAN_TORCH_SPEC"
    goto :install_torch_pip
)
call :detect_torch
:install_torch_pip
echo [setup] torch build: pip install !TORCH_SPEC!
echo [setup]   why: !TORCH_WHY!
"%VPY%" -m pip install --disable-pip-version-check !TORCH_SPEC!
if errorlevel 1 (
    echo [setup] ERROR: installing torch failed: pip install !TORCH_SPEC!
    exit /b 1
)
exit /b 0

rem Sets TORCH_SPEC and TORCH_WHY from the GPUs of this PC.
:detect_torch
set "TORCH_SPEC=%TORCH_DEFAULT%"
set "TORCH_WHY=no NVIDIA or supported AMD GPU found: running on the CPU"
set "ROCM_ARCH="
if defined WAN_ROCM_ARCH (
    set "ROCM_ARCH=!WAN_ROCM_ARCH!"
    set "ROCM_WHY=WAN_ROCM_ARCH is set"
    goto :detect_torch_rocm
)
rem NVIDIA: nvidia-smi comes with the driver.
nvidia-smi -L >nul 2>&1
if errorlevel 1 goto :detect_torch_amd
set "GPU="
for /f "delims=" %%G in ('nvidia-smi --query-gpu^=name --format^=csv^,noheader 2^>nul') do if not defined GPU set "GPU=%%G"
set "TORCH_SPEC=torch --index-url https://download.pytorch.org/whl/cu128"
set "TORCH_WHY=NVIDIA GPU found: !GPU! - the CUDA 12.8 build"
exit /b 0
:detect_torch_amd
rem AMD: read the names of the video controllers.
set "GPU_FILE=.venv\wan-gpus.txt"
if exist "%GPU_FILE%" del /q "%GPU_FILE%"
for /f "usebackq delims=" %%G in (`powershell -NoProfile -NonInteractive -Command "(Get-CimInstance Win32_VideoController).Name" 2^>nul`) do >>"%GPU_FILE%" echo %%G
if not exist "%GPU_FILE%" for /f "skip=1 delims=" %%G in ('wmic path win32_VideoController get name 2^>nul') do >>"%GPU_FILE%" echo %%G
if not exist "%GPU_FILE%" exit /b 0
set "GPU_NAMES="
for /f "usebackq delims=" %%G in ("%GPU_FILE%") do (
    if defined GPU_NAMES (set "GPU_NAMES=!GPU_NAMES!, %%G") else set "GPU_NAMES=%%G"
)
rem Strix Halo, e.g. "AMD Radeon(TM) 8060S Graphics" or "Ryzen AI Max"
findstr /i /c:"8060S" /c:"8050S" /c:"8040S" /c:"Ryzen AI Max" "%GPU_FILE%" >nul 2>&1
if not errorlevel 1 set "ROCM_ARCH=gfx1151"
rem RX 9000 series, RDNA 4
if not defined ROCM_ARCH (
    findstr /i /c:"RX 9" /c:"AI PRO R9" "%GPU_FILE%" >nul 2>&1
    if not errorlevel 1 set "ROCM_ARCH=gfx120X-all"
)
rem RX 7000 series, Radeon PRO W7000 and 780M/760M/740M iGPUs, RDNA 3
if not defined ROCM_ARCH (
    findstr /i /c:"RX 7" /c:"PRO W7" /c:"780M" /c:"760M" /c:"740M" "%GPU_FILE%" >nul 2>&1
    if not errorlevel 1 set "ROCM_ARCH=gfx110X-all"
)
if defined ROCM_ARCH (
    set "ROCM_WHY=AMD GPU found: !GPU_NAMES!"
    goto :detect_torch_rocm
)
findstr /i /c:"AMD" /c:"Radeon" "%GPU_FILE%" >nul 2>&1
if not errorlevel 1 set "TORCH_WHY=AMD GPU found: !GPU_NAMES! but no ROCm wheels are known for it, so running on the CPU. Set WAN_ROCM_ARCH to force a GPU family."
exit /b 0
:detect_torch_rocm
set "TORCH_SPEC=torch torchvision torchaudio --index-url https://repo.amd.com/rocm/whl/!ROCM_ARCH!/"
set "TORCH_WHY=!ROCM_WHY! - AMD's ROCm build for !ROCM_ARCH!"
exit /b 0
