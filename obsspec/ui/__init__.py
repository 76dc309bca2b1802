"""What people see: live displays (rich / plain / none) and, later, reports."""
